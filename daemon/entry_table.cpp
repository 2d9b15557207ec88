// Index and placement of parked entries (see entry_table.h).
#include "daemon/entry_table.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "daemon/clock.h"
#include "daemon/eviction_run.h"
#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

EntryTable::EntryTable(uint64_t data_bytes, uint64_t extent_align_bytes)
    : allocator_(data_bytes, extent_align_bytes) {}

EntryTable::~EntryTable() {
  // An adoption given up half way. The indexer first: it may be joining cells_writer_.
  if (indexer_.joinable()) indexer_.join();
  if (cells_writer_.joinable()) cells_writer_.join();
  for (Entry& e : slots_) set_tail(e, {});
}

void EntryTable::set_tail(Entry& e, std::span<const int32_t> tail) {
  delete[] e.tail_tokens.data;
  e.tail_tokens = {};
  if (tail.empty()) return;
  auto* copy = new int32_t[tail.size()];
  std::copy(tail.begin(), tail.end(), copy);
  e.tail_tokens = {.data = copy, .count = static_cast<uint32_t>(tail.size())};
}

Status EntryTable::register_namespace(const NamespaceId& id, const Geometry& g,
                                      uint32_t prefill_tokens_per_second, NamespaceIndex& ret_ns,
                                      const std::function<bool(NamespaceIndex)>& in_use) {
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
  if (namespaces_.size() < limits::namespaces_max) {
    ret_ns = static_cast<NamespaceIndex>(namespaces_.size());
    namespaces_.push_back(info);
    namespace_slots_.push_back(0);
  } else {
    // Full: the first index nothing holds. No entry, block index cell, snapshot list or
    // state record names it (each belongs to a slot), and the caller vouches for the rest.
    NamespaceIndex free = 0;
    while (free < namespaces_.size() && (namespace_slots_[free] != 0 || !in_use || in_use(free)))
      ++free;
    if (free == namespaces_.size()) return Status::LimitExceeded;
    namespace_by_id_.erase(namespaces_[free].id);
    namespaces_[free] = info;
    ++namespaces_reused_;
    ret_ns = free;
  }
  namespace_by_id_.emplace(id, ret_ns);
  if (state_ != nullptr) state_->write_namespace(ret_ns, info);
  return Status::Ok;
}

EntrySlot EntryTable::find_block(NamespaceIndex ns, const Hash128& hash) const {
  return blocks_.find(ns, hash);
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

Status EntryTable::allocate_extent(uint64_t bytes, uint64_t& ret_offset) {
  assert(bytes > 0 && bytes % allocator_.granularity_bytes() == 0);
  if (bytes > allocator_.bytes_free() + order_.evictable_bytes()) return Status::ArenaFull;
  while (!allocator_.allocate(bytes, ret_offset)) {
    // The policy's victim frees a run at least as long as its own extent: room for an
    // extent no larger (blocks of one size never need more). A larger extent takes the
    // cheapest stretch that holds it, not whatever the policy's order frees until
    // some run happens to be long enough (twice the need, or more, on a fragmented
    // arena).
    const EntrySlot victim = order_.host_tail() == no_slot ? no_slot
                             : victim_policy_ != nullptr ? victim_policy_(*this)
                                                         : order_.host_tail();
    if (victim == no_slot) return Status::ArenaFull;
    if (slots_[victim].extent_bytes >= bytes) {
      evict_for_room(victim);
    } else if (!evict_cheapest_run(bytes)) {
      return Status::ArenaFull;  // entries that may not go split every stretch
    }
  }
  return Status::Ok;
}

void EntryTable::evict_for_room(EntrySlot slot) {
  ++room_evictions_;
  room_eviction_bytes_ += slots_[slot].extent_bytes;
  evict_host(slot);
}

bool EntryTable::evict_cheapest_run(uint64_t bytes) {
  std::vector<ArenaPiece> pieces;
  allocator_.for_each_free_run([&](uint64_t offset, uint64_t run_bytes) {
    pieces.push_back(ArenaPiece{.offset = offset, .bytes = run_bytes});
  });
  for (EntrySlot slot = 0; slot < slots_.size(); ++slot) {
    const Entry& e = slots_[slot];
    if (!e.in_use || !e.on_host) continue;
    const bool evictable = e.on_lru;
    pieces.push_back(ArenaPiece{
        .offset = e.extent_offset,
        .bytes = e.extent_bytes,
        .slot = slot,
        .evictable = evictable,
        .cost = !evictable               ? 0.0
                : eviction_cost_ != nullptr ? eviction_cost_(*this, slot)
                                            : double(e.extent_bytes)});
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const ArenaPiece& a, const ArenaPiece& b) { return a.offset < b.offset; });
  size_t first = 0, end = 0;
  if (!cheapest_run(pieces, bytes, &first, &end)) return false;
  for (size_t i = first; i < end; ++i) {
    if (pieces[i].slot == no_slot) continue;
    ++run_evictions_;
    evict_for_room(pieces[i].slot);
  }
  return true;
}

EntrySlot EntryTable::new_slot(const NewEntry& n, uint64_t last_use_usec) {
  assert(n.ns < namespaces_.size() && n.extent_bytes > 0);
  EntrySlot slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = Entry{};
  } else {
    slot = static_cast<EntrySlot>(slots_.size());
    slots_.emplace_back();
    generations_.push_back(1);
  }
  Entry& e = slots_[slot];
  e.key_hash = n.key_hash;
  e.parent_hash = n.parent_hash;
  set_tail(e, n.tail_tokens);
  e.extent_bytes = n.extent_bytes;
  e.creator_session = n.creator_session;
  e.payload_checksum = n.payload_checksum;
  e.last_use_tick = ++tick_;
  e.last_use_usec = last_use_usec;
  e.ns = n.ns;
  e.position = n.position;
  e.anchor_chunks = n.anchor_chunks;
  e.kind = n.kind;
  e.entry_class = n.entry_class;
  e.evidence = n.evidence;
  e.reserved_by = n.reserved_by;
  e.in_use = true;
  ++slots_in_use_;
  ++namespace_slots_[n.ns];
  return slot;
}

void EntryTable::index(EntrySlot slot) {
  const Entry& e = slots_[slot];
  if (e.kind == EntryKind::Block) {
    const bool inserted = blocks_.insert(e.ns, e.key_hash, slot);
    assert(inserted && "caller checks find_block first");
    (void)inserted;
  } else {
    snapshots_[{e.ns, e.key_hash}].push_back(slot);
    ++namespaces_[e.ns].indexed_snapshots;
  }
}

Status EntryTable::insert_reserved(const NewEntry& n, EntrySlot& ret_slot) {
  uint64_t offset = 0;
  if (Status s = allocate_extent(n.extent_bytes, offset); s != Status::Ok) return s;
  const EntrySlot slot = new_slot(n, coarse_monotonic_usec());
  Entry& e = slots_[slot];
  e.extent_offset = offset;
  // Before anyone may write into the extent: a crash from here on leaves it held.
  if (state_ != nullptr) e.state_record = state_->write_reservation(e, namespaces_[e.ns]);
  index(slot);
  ret_slot = slot;
  return Status::Ok;
}

Status EntryTable::insert_on_disk(const NewEntry& n, uint64_t disk_bytes, EntrySlot& ret_slot) {
  const EntrySlot slot = new_slot(n, coarse_monotonic_usec());
  Entry& e = slots_[slot];
  e.on_host = false;
  e.sealed = true;
  e.kind == EntryKind::Block ? ++sealed_blocks_ : ++sealed_snapshots_;
  NamespaceInfo& info = namespaces_[e.ns];
  e.kind == EntryKind::Block ? ++info.blocks : ++info.snapshots;
  index(slot);
  attach_disk_record(slot, disk_bytes);
  ret_slot = slot;
  return Status::Ok;
}

void EntryTable::seal(EntrySlot slot, uint64_t payload_checksum, uint64_t now_usec) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && !e.sealed && e.on_host);
  e.sealed = true;
  e.payload_checksum = payload_checksum;
  e.last_use_usec = now_usec;
  count_sealed(e);
  record_host_copy(slot);
  sync_lists(slot, true);
}

void EntryTable::count_sealed(const Entry& e) {
  NamespaceInfo& info = namespaces_[e.ns];
  info.bytes += e.extent_bytes;
  if (e.kind == EntryKind::Block) {
    ++info.blocks;
    ++sealed_blocks_;
  } else {
    ++info.snapshots;
    ++sealed_snapshots_;
  }
}

void EntryTable::uncount_sealed(const Entry& e) {
  NamespaceInfo& info = namespaces_[e.ns];
  if (e.kind == EntryKind::Block) {
    --info.blocks;
    --sealed_blocks_;
  } else {
    --info.snapshots;
    --sealed_snapshots_;
  }
}

void EntryTable::record_host_copy(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (state_ != nullptr) e.state_record = state_->write(e, namespaces_[e.ns]);
}

void EntryTable::forget_record(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.state_record == no_record) return;
  assert(state_ != nullptr);
  // Before the extent is free for anyone else.
  if (e.sealed) {
    state_->clear(e.state_record);
  } else {
    state_->end_reservation(e.state_record);
  }
  e.state_record = no_record;
}

void EntryTable::remove_from_index(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (e.kind == EntryKind::Block) {
    blocks_.erase(e.ns, e.key_hash);
  } else {
    auto it = snapshots_.find({e.ns, e.key_hash});
    assert(it != snapshots_.end());
    std::erase(it->second, slot);
    if (it->second.empty()) snapshots_.erase(it);
    --namespaces_[e.ns].indexed_snapshots;
  }
}

void EntryTable::free_slot(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(!e.on_lru && !e.on_disk_lru && e.leases == 0 && e.io_pins == 0 &&
         e.state_record == no_record);
  if (e.pinned) --pinned_;
  release_disk_predecessor(slot);  // a spill that never finished
  set_tail(e, {});
  --namespace_slots_[e.ns];
  e = Entry{};
  ++generations_[slot];
  free_slots_.push_back(slot);
  --slots_in_use_;
}

void EntryTable::drop_host_copy(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.on_host);
  if (e.on_lru) order_.remove_host(slot);
  forget_record(slot);
  if (e.adoption_hold) held_bytes_ -= e.extent_bytes;
  e.adoption_hold = false;
  allocator_.free(e.extent_offset, e.extent_bytes);
  if (e.sealed) namespaces_[e.ns].bytes -= e.extent_bytes;
  e.on_host = false;
  e.promoting = false;
  e.extent_offset = 0;
}

void EntryTable::erase(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.leases == 0 && e.io_pins == 0);
  if (e.on_lru) order_.remove_host(slot);
  if (e.on_disk_lru) order_.remove_disk(slot);
  if (e.on_disk) forget_disk_copy(slot);
  if (e.on_host) drop_host_copy(slot);
  if (e.sealed && !e.dead) uncount_sealed(e);
  if (!e.dead) remove_from_index(slot);
  free_slot(slot);
}

Status EntryTable::begin_promotion(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.sealed && !e.dead && !e.on_host && e.on_disk);
  uint64_t offset = 0;
  if (Status s = allocate_extent(e.extent_bytes, offset); s != Status::Ok) return s;
  e.extent_offset = offset;
  e.on_host = true;
  e.promoting = true;
  namespaces_[e.ns].bytes += e.extent_bytes;
  sync_lists(slot, false);
  return Status::Ok;
}

void EntryTable::finish_promotion(EntrySlot slot, bool success) {
  Entry& e = slots_.at(slot);
  assert(e.on_host && e.promoting);
  e.promoting = false;
  if (!success) drop_host_copy(slot);
  if (success && !e.dead) record_host_copy(slot);
  sync_lists(slot, true);
}

void EntryTable::attach_disk_record(EntrySlot slot, uint64_t disk_bytes) {
  Entry& e = slots_.at(slot);
  assert(e.sealed && !e.on_disk);
  e.on_disk = true;
  e.disk_bytes = disk_bytes;
  namespaces_[e.ns].disk_bytes += disk_bytes;
  disk_bytes_ += disk_bytes;
  ++disk_entries_;
  hold_disk_predecessor(slot);
  sync_lists(slot, true);
}

void EntryTable::hold_disk_predecessor(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  if (e.disk_predecessor_id != no_entry_id || e.anchor_chunks == 0) return;
  const NamespaceInfo& info = namespaces_[e.ns];
  if (e.kind == EntryKind::Snapshot && info.geometry.block_tokens == 0) return;
  const EntrySlot predecessor =
      find_block(e.ns, e.kind == EntryKind::Block ? e.parent_hash : e.key_hash);
  if (predecessor == no_slot) return;  // nothing to hold: the record is unreachable anyway
  e.disk_predecessor_id = entry_id(predecessor);
  ++slots_[predecessor].disk_dependents;
  sync_lists(predecessor, false);
}

void EntryTable::release_disk_predecessor(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  const uint64_t id = std::exchange(e.disk_predecessor_id, no_entry_id);
  if (id == no_entry_id) return;
  const auto predecessor = static_cast<EntrySlot>(id & 0xffffffffu);
  // Freed meanwhile (its slot's generation moved on): its count went with it.
  if (generations_.at(predecessor) != id >> 32) return;
  Entry& p = slots_[predecessor];
  assert(p.in_use && p.disk_dependents > 0);
  --p.disk_dependents;
  if (disk_evictable(p) && !p.on_disk_lru) order_.disk_push_back(predecessor);
}

void EntryTable::forget_disk_copy(EntrySlot slot) {
  Entry& e = slots_[slot];
  assert(e.on_disk);
  if (e.on_disk_lru) order_.remove_disk(slot);
  release_disk_predecessor(slot);
  namespaces_[e.ns].disk_bytes -= e.disk_bytes;
  disk_bytes_ -= e.disk_bytes;
  --disk_entries_;
  e.on_disk = false;
  e.disk_bytes = 0;
}

bool EntryTable::detach_disk_record(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.on_disk && e.io_pins == 0);
  forget_disk_copy(slot);
  if (!e.on_host) {
    erase(slot);
    return false;
  }
  sync_lists(slot, false);
  return true;
}

void EntryTable::kill(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.sealed && !e.dead);
  if (e.on_disk) forget_disk_copy(slot);
  if (e.on_lru) order_.remove_host(slot);
  uncount_sealed(e);
  remove_from_index(slot);
  forget_record(slot);  // never adopted again, whoever still reads it now
  e.dead = true;
  (void)free_if_dead_and_unused(slot);
}

bool EntryTable::evict_lru() {
  if (order_.host_tail() == no_slot) return false;
  evict_host(victim_policy_ != nullptr ? victim_policy_(*this) : order_.host_tail());
  return true;
}

void EntryTable::evict_host(EntrySlot slot) {
  assert(slots_.at(slot).on_lru);
  // An entry with a disk copy only leaves the host; the rest leave altogether.
  if (slots_[slot].on_disk) {
    drop_host_copy(slot);
    sync_lists(slot, false);
  } else {
    erase(slot);
  }
  ++evictions_;
}

void EntryTable::acquire_lease(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed && !e.dead);
  ++e.leases;
  sync_lists(slot, false);
}

void EntryTable::release_lease(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed && e.leases > 0);
  --e.leases;
  if (!free_if_dead_and_unused(slot)) sync_lists(slot, true);
}

bool EntryTable::free_if_dead_and_unused(EntrySlot slot) {
  Entry& e = slots_[slot];
  if (!e.dead) return false;
  // An adopted extent outlives its entry while the previous instance's leases may
  // still read it (release_adoption_hold() frees it then).
  if (e.leases == 0 && e.io_pins == 0 && !e.adoption_hold) {
    if (e.on_host) drop_host_copy(slot);
    free_slot(slot);
  }
  return true;
}

void EntryTable::pin_io(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.in_use);
  ++e.io_pins;
  sync_lists(slot, false);
}

void EntryTable::unpin_io(EntrySlot slot) {
  Entry& e = slots_.at(slot);
  assert(e.io_pins > 0);
  --e.io_pins;
  if (!free_if_dead_and_unused(slot)) sync_lists(slot, false);
}

void EntryTable::touch(EntrySlot slot, uint64_t now_usec) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed);
  ++e.hits;
  e.last_use_tick = ++tick_;
  e.last_use_usec = now_usec != 0 ? now_usec : coarse_monotonic_usec();
  if (e.state_record != no_record) state_->use(e.state_record, e);
  // A leased entry is off the lists: its place is set when the lease ends.
  if (e.leases == 0) sync_lists(slot, true);
}

EntrySlot EntryTable::slot_for_id(uint64_t id) const {
  const auto slot = static_cast<EntrySlot>(id & 0xffffffffu);
  if (slot >= slots_.size() || generations_[slot] != (id >> 32) || !slots_[slot].in_use ||
      slots_[slot].dead) {
    return no_slot;
  }
  return slot;
}

void EntryTable::set_pinned(EntrySlot slot, bool pinned) {
  Entry& e = slots_.at(slot);
  assert(e.in_use && e.sealed);
  if (e.pinned == pinned) return;
  e.pinned = pinned;
  pinned ? ++pinned_ : --pinned_;
  if (e.state_record != no_record) state_->upgrade(e.state_record, e);
  sync_lists(slot, true);
}

bool EntryTable::upgrade(EntrySlot slot, EntryClass entry_class, Evidence evidence) {
  Entry& e = slots_.at(slot);
  bool changed = false;
  if (entry_class == EntryClass::Shared && e.entry_class != EntryClass::Shared) {
    e.entry_class = EntryClass::Shared;
    changed = true;
  }
  // Any evidence beats the default; explicit breakpoints beat everything.
  if (evidence != e.evidence && (e.evidence == Evidence::DefaultAutomatic ||
                                 evidence == Evidence::ExplicitBreakpoint)) {
    e.evidence = evidence;
    changed = true;
  }
  if (changed && e.state_record != no_record) state_->upgrade(e.state_record, e);
  return changed;
}

}  // namespace kvpark::daemon
