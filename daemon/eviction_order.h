// The eviction order: two intrusive LRU lists over the entry table's slots, one of
// the entries host eviction may take and one of the disk copies disk eviction may
// take, most recently used at the head. The entry table says what is evictable (its
// placement rules); this keeps the order, and eviction_policy.h picks from its cold
// end. The links live in Entry (lru_*, disk_*), so every move is O(1) and allocates
// nothing.
//
// Invariants: an entry is on a list iff its on_lru / on_disk_lru flag is set;
// evictable_bytes() is the sum of extent_bytes over the host list.
#pragma once

#include <cassert>
#include <cstdint>
#include <vector>

#include "daemon/entry.h"
#include "daemon/huge_page_allocator.h"

namespace kvpark::daemon {

class EvictionOrder {
 public:
  explicit EvictionOrder(HugePageVector<Entry>& slots) : slots_(slots) {}
  EvictionOrder(const EvictionOrder&) = delete;
  EvictionOrder& operator=(const EvictionOrder&) = delete;

  // Puts the entry on, or takes it off, each list as `host` and `disk` (evictable
  // now) say; `to_front` makes an entry that stays listed the most recent.
  void sync(EntrySlot slot, bool host, bool disk, bool to_front);
  // Takes the entry off a list it is on.
  void remove_host(EntrySlot slot);
  void remove_disk(EntrySlot slot);
  // Lists an unlisted disk copy as the next to evict.
  void disk_push_back(EntrySlot slot);

  EntrySlot host_tail() const { return lru_tail_; }  // the next to evict
  EntrySlot host_prev(EntrySlot slot) const { return slots_.at(slot).lru_prev; }
  EntrySlot disk_tail() const { return disk_tail_; }
  uint64_t evictable_bytes() const { return evictable_bytes_; }

 private:
  void link_front(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev,
                  EntrySlot Entry::*next, EntrySlot slot);
  void unlink(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev, EntrySlot Entry::*next,
              EntrySlot slot);
  void host_push_front(EntrySlot slot);
  void disk_push_front(EntrySlot slot);

  HugePageVector<Entry>& slots_;  // the entry table's slab
  EntrySlot lru_head_ = no_slot;  // most recent
  EntrySlot lru_tail_ = no_slot;  // next to evict
  EntrySlot disk_head_ = no_slot;
  EntrySlot disk_tail_ = no_slot;
  uint64_t evictable_bytes_ = 0;  // extents on the host list
};

// Inline: every lease, touch and seal moves an entry on these lists.
inline void EvictionOrder::sync(EntrySlot slot, bool host, bool disk, bool to_front) {
  Entry& e = slots_[slot];
  if (e.on_lru && (!host || to_front)) remove_host(slot);
  if (host && !e.on_lru) host_push_front(slot);
  if (e.on_disk_lru && (!disk || to_front)) remove_disk(slot);
  if (disk && !e.on_disk_lru) disk_push_front(slot);
}

// The host and disk eviction lists are the same intrusive list over different links.
inline void EvictionOrder::link_front(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev,
                               EntrySlot Entry::*next, EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.*prev == no_slot && e.*next == no_slot && head != slot);
  e.*next = head;
  if (head != no_slot) slots_[head].*prev = slot;
  head = slot;
  if (tail == no_slot) tail = slot;
}

inline void EvictionOrder::unlink(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev,
                           EntrySlot Entry::*next, EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.*prev != no_slot) slots_[e.*prev].*next = e.*next;
  else head = e.*next;
  if (e.*next != no_slot) slots_[e.*next].*prev = e.*prev;
  else tail = e.*prev;
  e.*prev = e.*next = no_slot;
}

inline void EvictionOrder::host_push_front(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(!e.on_lru);
  link_front(lru_head_, lru_tail_, &Entry::lru_prev, &Entry::lru_next, slot);
  e.on_lru = true;
  evictable_bytes_ += e.extent_bytes;
}

inline void EvictionOrder::remove_host(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.on_lru && evictable_bytes_ >= e.extent_bytes);
  unlink(lru_head_, lru_tail_, &Entry::lru_prev, &Entry::lru_next, slot);
  e.on_lru = false;
  evictable_bytes_ -= e.extent_bytes;
}

inline void EvictionOrder::disk_push_front(EntrySlot slot) {
  assert(!slots_[slot].on_disk_lru);
  link_front(disk_head_, disk_tail_, &Entry::disk_prev, &Entry::disk_next, slot);
  slots_[slot].on_disk_lru = true;
}

inline void EvictionOrder::disk_push_back(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(!e.on_disk_lru && e.disk_prev == no_slot && e.disk_next == no_slot);
  e.disk_prev = disk_tail_;
  if (disk_tail_ != no_slot) slots_[disk_tail_].disk_next = slot;
  disk_tail_ = slot;
  if (disk_head_ == no_slot) disk_head_ = slot;
  e.on_disk_lru = true;
}

inline void EvictionOrder::remove_disk(EntrySlot slot) {
  assert(slots_[slot].on_disk_lru);
  unlink(disk_head_, disk_tail_, &Entry::disk_prev, &Entry::disk_next, slot);
  slots_[slot].on_disk_lru = false;
}

}  // namespace kvpark::daemon
