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

#include <cstdint>
#include <vector>

#include "daemon/entry.h"

namespace kvpark::daemon {

class EvictionOrder {
 public:
  explicit EvictionOrder(std::vector<Entry>& slots) : slots_(slots) {}
  EvictionOrder(const EvictionOrder&) = delete;
  EvictionOrder& operator=(const EvictionOrder&) = delete;

  // Puts the entry on, or takes it off, each list as `host` and `disk` (evictable
  // now) say; `to_front` makes an entry that stays listed the most recent.
  void sync(EntrySlot slot, bool host, bool disk, bool to_front);
  // Takes the entry off a list it is on.
  void remove_host(EntrySlot slot);
  void remove_disk(EntrySlot slot);

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

  std::vector<Entry>& slots_;  // the entry table's slab
  EntrySlot lru_head_ = no_slot;  // most recent
  EntrySlot lru_tail_ = no_slot;  // next to evict
  EntrySlot disk_head_ = no_slot;
  EntrySlot disk_tail_ = no_slot;
  uint64_t evictable_bytes_ = 0;  // extents on the host list
};

}  // namespace kvpark::daemon
