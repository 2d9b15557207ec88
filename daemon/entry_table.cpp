// Index, placement and LRU eviction of parked entries (see entry_table.h).
#include "daemon/entry_table.h"

#include <algorithm>
#include <cassert>

#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {
namespace {

uint64_t coarse_now_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

}  // namespace

EntryTable::EntryTable(uint64_t data_bytes, uint64_t extent_align_bytes)
    : allocator_(data_bytes, extent_align_bytes) {}

Status EntryTable::register_namespace(const NamespaceId& id, const Geometry& g,
                                      uint32_t prefill_tokens_per_second,
                                      NamespaceIndex& ret_ns) {
  const bool snapshot_only = g.block_tokens == 0;
  const bool valid = g.block_tokens <= limits::block_tokens_max &&
                     (snapshot_only ? g.block_payload_bytes == 0 && g.snapshot_required
                                    : g.block_payload_bytes > 0 &&
                                          g.block_payload_bytes <= limits::block_payload_bytes_max);
  if (!valid) return Status::InvalidArgument;
  if (auto it = namespace_by_id_.find(id); it != namespace_by_id_.end()) {
    NamespaceInfo& info = namespaces_[it->second];
    if (info.geometry != g) return Status::GeometryMismatch;
    if (prefill_tokens_per_second != 0) info.prefill_tokens_per_second = prefill_tokens_per_second;
    ret_ns = it->second;
    return Status::Ok;
  }
  NamespaceInfo info;
  info.id = id;
  info.geometry = g;
  info.chain_tokens = snapshot_only ? limits::snapshot_chain_tokens : g.block_tokens;
  info.block_extent_bytes =
      snapshot_only ? 0 : shm::extent_bytes_for(g.block_tokens, g.block_payload_bytes);
  info.prefill_tokens_per_second = prefill_tokens_per_second;
  ret_ns = static_cast<NamespaceIndex>(namespaces_.size());
  namespaces_.push_back(info);
  namespace_by_id_.emplace(id, ret_ns);
  return Status::Ok;
}

EntrySlot EntryTable::find_block(NamespaceIndex ns, const Hash128& hash) const {
  auto it = blocks_.find({ns, hash});
  return it == blocks_.end() ? no_slot : it->second;
}

EntrySlot EntryTable::find_snapshot(NamespaceIndex ns, const Hash128& anchor,
                                    std::span<const int32_t> tail) const {
  auto it = snapshots_.find({ns, anchor});
  if (it == snapshots_.end()) return no_slot;
  for (EntrySlot slot : it->second) {
    const auto& stored = slots_[slot].tail_tokens;
    if (std::equal(stored.begin(), stored.end(), tail.begin(), tail.end())) return slot;
  }
  return no_slot;
}

std::span<const EntrySlot> EntryTable::snapshots_at(NamespaceIndex ns,
                                                    const Hash128& anchor) const {
  auto it = snapshots_.find({ns, anchor});
  if (it == snapshots_.end()) return {};
  return it->second;
}

Status EntryTable::insert_reserved(const NewEntry& n, EntrySlot& ret_slot) {
  assert(n.ns < namespaces_.size() && n.extent_bytes > 0);
  assert(n.extent_bytes % allocator_.granularity_bytes() == 0);
  if (n.extent_bytes > allocator_.bytes_free() + evictable_bytes_) return Status::ArenaFull;
  uint64_t offset = 0;
  while (!allocator_.allocate(n.extent_bytes, offset)) {
    // Free space is fragmented: evict until a run is large enough.
    if (lru_tail_ == no_slot) return Status::ArenaFull;
    evict_one();
  }
  EntrySlot slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<EntrySlot>(slots_.size());
    slots_.emplace_back();
    generations_.push_back(1);
  }
  Entry& e = slots_[slot];
  e = Entry{};
  e.key_hash = n.key_hash;
  e.tail_tokens.assign(n.tail_tokens.begin(), n.tail_tokens.end());
  e.extent_offset = offset;
  e.extent_bytes = n.extent_bytes;
  e.creator_session = n.creator_session;
  e.last_use_tick = ++tick_;
  e.last_use_usec = coarse_now_usec();
  e.ns = n.ns;
  e.position = n.position;
  e.anchor_chunks = n.anchor_chunks;
  e.kind = n.kind;
  e.entry_class = n.entry_class;
  e.evidence = n.evidence;
  e.in_use = true;
  ++slots_in_use_;
  if (n.kind == EntryKind::Block) {
    auto [it, inserted] = blocks_.emplace(BlockKey{n.ns, n.key_hash}, slot);
    assert(inserted && "caller checks find_block first");
  } else {
    snapshots_[{n.ns, n.key_hash}].push_back(slot);
  }
  ret_slot = slot;
  return Status::Ok;
}

void EntryTable::seal(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && !e.sealed);
  e.sealed = true;
  NamespaceInfo& info = namespaces_[e.ns];
  info.bytes += e.extent_bytes;
  if (e.kind == EntryKind::Block) {
    ++info.blocks;
    ++sealed_blocks_;
  } else {
    ++info.snapshots;
    ++sealed_snapshots_;
  }
  lru_push_front(slot);
}

void EntryTable::remove_from_index(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.kind == EntryKind::Block) {
    blocks_.erase({e.ns, e.key_hash});
  } else {
    auto it = snapshots_.find({e.ns, e.key_hash});
    assert(it != snapshots_.end());
    std::erase(it->second, slot);
    if (it->second.empty()) snapshots_.erase(it);
  }
}

void EntryTable::erase(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.leases == 0);
  if (e.pinned) --pinned_;
  if (e.sealed) {
    if (!e.pinned) lru_unlink(slot);
    NamespaceInfo& info = namespaces_[e.ns];
    info.bytes -= e.extent_bytes;
    if (e.kind == EntryKind::Block) {
      --info.blocks;
      --sealed_blocks_;
    } else {
      --info.snapshots;
      --sealed_snapshots_;
    }
  }
  remove_from_index(slot);
  allocator_.free(e.extent_offset, e.extent_bytes);
  e = Entry{};
  ++generations_[slot];
  free_slots_.push_back(slot);
  --slots_in_use_;
}

void EntryTable::evict_one() {
  assert(lru_tail_ != no_slot);
  erase(lru_tail_);
  ++evictions_;
}

bool EntryTable::evict_lru() {
  if (lru_tail_ == no_slot) return false;
  evict_one();
  return true;
}

void EntryTable::acquire_lease(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed);
  if (e.leases++ == 0 && !e.pinned) lru_unlink(slot);
}

void EntryTable::release_lease(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed && e.leases > 0);
  if (--e.leases == 0 && !e.pinned) lru_push_front(slot);
}

void EntryTable::touch(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed);
  ++e.hits;
  e.last_use_tick = ++tick_;
  e.last_use_usec = coarse_now_usec();
  if (evictable(e)) {
    lru_unlink(slot);
    lru_push_front(slot);
  }
}

EntrySlot EntryTable::slot_for_id(uint64_t id) const {
  const auto slot = static_cast<EntrySlot>(id & 0xffffffffu);
  if (slot >= slots_.size() || generations_[slot] != (id >> 32) || !slots_[slot].in_use) {
    return no_slot;
  }
  return slot;
}

void EntryTable::set_pinned(EntrySlot slot, bool pinned) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed);
  if (e.pinned == pinned) return;
  const bool was_evictable = evictable(e);
  e.pinned = pinned;
  pinned ? ++pinned_ : --pinned_;
  if (was_evictable) lru_unlink(slot);
  if (evictable(e)) lru_push_front(slot);
}

void EntryTable::lru_push_front(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(evictable(e) && e.lru_prev == no_slot && e.lru_next == no_slot && lru_head_ != slot);
  e.lru_next = lru_head_;
  if (lru_head_ != no_slot) slots_[lru_head_].lru_prev = slot;
  lru_head_ = slot;
  if (lru_tail_ == no_slot) lru_tail_ = slot;
  evictable_bytes_ += e.extent_bytes;
}

void EntryTable::lru_unlink(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.lru_prev != no_slot) slots_[e.lru_prev].lru_next = e.lru_next;
  else lru_head_ = e.lru_next;
  if (e.lru_next != no_slot) slots_[e.lru_next].lru_prev = e.lru_prev;
  else lru_tail_ = e.lru_prev;
  e.lru_prev = e.lru_next = no_slot;
  assert(evictable_bytes_ >= e.extent_bytes);
  evictable_bytes_ -= e.extent_bytes;
}

}  // namespace kvpark::daemon
