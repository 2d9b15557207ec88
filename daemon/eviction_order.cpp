// The host and disk eviction lists (see eviction_order.h).
#include "daemon/eviction_order.h"

#include <cassert>

namespace kvpark::daemon {

void EvictionOrder::sync(EntrySlot slot, bool host, bool disk, bool to_front) {
  Entry& e = slots_[slot];
  if (e.on_lru && (!host || to_front)) remove_host(slot);
  if (host && !e.on_lru) host_push_front(slot);
  if (e.on_disk_lru && (!disk || to_front)) remove_disk(slot);
  if (disk && !e.on_disk_lru) disk_push_front(slot);
}

// The host and disk eviction lists are the same intrusive list over different links.
void EvictionOrder::link_front(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev,
                               EntrySlot Entry::*next, EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.*prev == no_slot && e.*next == no_slot && head != slot);
  e.*next = head;
  if (head != no_slot) slots_[head].*prev = slot;
  head = slot;
  if (tail == no_slot) tail = slot;
}

void EvictionOrder::unlink(EntrySlot& head, EntrySlot& tail, EntrySlot Entry::*prev,
                           EntrySlot Entry::*next, EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.*prev != no_slot) slots_[e.*prev].*next = e.*next;
  else head = e.*next;
  if (e.*next != no_slot) slots_[e.*next].*prev = e.*prev;
  else tail = e.*prev;
  e.*prev = e.*next = no_slot;
}

void EvictionOrder::host_push_front(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(!e.on_lru);
  link_front(lru_head_, lru_tail_, &Entry::lru_prev, &Entry::lru_next, slot);
  e.on_lru = true;
  evictable_bytes_ += e.extent_bytes;
}

void EvictionOrder::remove_host(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.on_lru && evictable_bytes_ >= e.extent_bytes);
  unlink(lru_head_, lru_tail_, &Entry::lru_prev, &Entry::lru_next, slot);
  e.on_lru = false;
  evictable_bytes_ -= e.extent_bytes;
}

void EvictionOrder::disk_push_front(EntrySlot slot) {
  assert(!slots_[slot].on_disk_lru);
  link_front(disk_head_, disk_tail_, &Entry::disk_prev, &Entry::disk_next, slot);
  slots_[slot].on_disk_lru = true;
}

void EvictionOrder::remove_disk(EntrySlot slot) {
  assert(slots_[slot].on_disk_lru);
  unlink(disk_head_, disk_tail_, &Entry::disk_prev, &Entry::disk_next, slot);
  slots_[slot].on_disk_lru = false;
}

}  // namespace kvpark::daemon
