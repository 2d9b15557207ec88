// Index and placement of parked entries (see entry_table.h).
#include "daemon/entry_table.h"

#include <algorithm>
#include <cassert>
#include <system_error>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "daemon/clock.h"
#include "daemon/eviction_run.h"
#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

namespace {
// Adopted entries are indexed and claimed this many at a time (BlockIndex::insert_batch):
// 1.5 MiB of keys, enough that each batch writes the cells nearly front to back.
constexpr size_t adoption_batch = 65536;

// Sizes one of adoption's batch buffers (1.5 MiB at full size): a buffer of a MiB or more
// takes a huge page allocation. On 4 KiB pages its first batch would cost a fault per page,
// on the VMs kvpark runs on as much as a tenth of adoption's time (huge_page_allocator.h).
template <typename T>
void reserve_batch(HugePageVector<T>& buffer, size_t entries) {
  const size_t wanted = std::min(entries, adoption_batch);
  const size_t huge = huge_allocation_bytes_min / sizeof(T) + 1;  // past the minimum
  buffer.reserve(wanted * sizeof(T) >= (size_t{1} << 20) ? std::max(wanted, huge) : wanted);
}
}  // namespace

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

void EntryTable::begin_adoption(size_t entries) {
  assert(slots_in_use_ == 0 && !adoption_claims_);
  slots_.reserve(entries);
  generations_.reserve(entries);
  // The block index's cells are written empty (64 MiB for 1M entries) on another core
  // while the first batch is adopted; the first batch's indexing waits for them.
  try {
    cells_writer_ = std::thread([this, entries] { blocks_.reserve(entries); });
  } catch (const std::system_error&) {
    blocks_.reserve(entries);
  }
  adoption_claims_ =
      std::make_unique<shm::ExtentClaims>(allocator_.capacity_bytes(), allocator_.granularity_bytes());
  reserve_batch(adoption_blocks_, entries);
  reserve_batch(adoption_extents_, entries);
  reserve_batch(indexing_blocks_, entries);
  reserve_batch(indexing_extents_, entries);
  adoption_refused_ = {};
}

Status EntryTable::insert_adopted(const NewEntry& n, uint64_t extent_offset, uint32_t record,
                                  uint64_t hits, uint64_t last_use_usec, bool pinned,
                                  EntrySlot& ret_slot) {
  assert(adoption_claims_);
  const bool block = n.kind == EntryKind::Block;
  if (!block && find_snapshot(n.ns, n.key_hash, n.tail_tokens) != no_slot) return Status::Corrupt;
  const EntrySlot slot = new_slot(n, last_use_usec);
  Entry& e = slots_[slot];
  e.extent_offset = extent_offset;
  e.sealed = true;
  e.state_record = record;
  e.hits = hits;
  e.adoption_hold = true;
  held_bytes_ += e.extent_bytes;
  count_sealed(e);
  if (pinned) {
    e.pinned = true;
    ++pinned_;
  }
  ret_slot = slot;
  if (block) {
    adoption_blocks_.push_back({.hash = e.key_hash, .ns = e.ns, .slot = slot});
  } else {
    index(slot);
  }
  // Last: claiming the batch may refuse this very entry (finish_adoption() says so).
  adoption_extents_.push_back(
      {.offset = e.extent_offset, .bytes = e.extent_bytes, .slot = slot, .block = block});
  if (adoption_extents_.size() == adoption_batch) hand_over_adopted_batch(false);
  return Status::Ok;
}

Status EntryTable::insert_adopted_reservation(const NewEntry& n, uint64_t extent_offset,
                                              uint32_t record, EntrySlot& ret_slot) {
  assert(adoption_claims_);
  const EntrySlot slot = new_held_reservation(n, extent_offset, record);
  const Entry& e = slots_[slot];
  ret_slot = slot;
  adoption_extents_.push_back(
      {.offset = e.extent_offset, .bytes = e.extent_bytes, .slot = slot, .block = false});
  if (adoption_extents_.size() == adoption_batch) hand_over_adopted_batch(false);
  return Status::Ok;
}

EntrySlot EntryTable::new_held_reservation(const NewEntry& n, uint64_t extent_offset,
                                           uint32_t record) {
  const EntrySlot slot = new_slot(n, 0);
  Entry& e = slots_[slot];
  e.extent_offset = extent_offset;
  e.state_record = record;
  e.dead = true;  // out of the index: nobody reads it, its extent goes with the hold
  e.adoption_hold = true;
  held_bytes_ += e.extent_bytes;
  ++held_reservations_;
  return slot;
}

void EntryTable::hand_over_adopted_batch(bool last) {
  take_claimed_batch();  // the batch before, if any: the indexer is free again after it
  std::swap(adoption_blocks_, indexing_blocks_);
  std::swap(adoption_extents_, indexing_extents_);
  adoption_blocks_.clear();
  adoption_extents_.clear();
  if (indexing_extents_.empty()) return;
  auto index_and_claim = [this] {
    if (cells_writer_.joinable()) cells_writer_.join();
    index_and_claim_batch();
  };
  if (last) {
    index_and_claim();  // nothing left to overlap it with
    return;
  }
  try {
    indexer_ = std::thread(index_and_claim);
  } catch (const std::system_error&) {
    index_and_claim();  // no thread to be had: the same work, in line
  }
}

void EntryTable::index_and_claim_batch() {
  std::vector<EntrySlot> duplicates;  // blocks whose key an earlier record holds
  blocks_.insert_batch(indexing_blocks_, duplicates);
  std::sort(duplicates.begin(), duplicates.end());
  const auto duplicate = [&duplicates](EntrySlot slot) {
    return !duplicates.empty() && std::binary_search(duplicates.begin(), duplicates.end(), slot);
  };
  // The entries the index took claim their extents now, in record order. Not before: a
  // duplicate refused above must not have cost a later record its extent.
  std::vector<EntrySlot>& refused = indexing_refused_;
  refused.clear();
  std::unordered_set<BlockKey, BlockKeyHasher> open;  // keys whose record lost its extent
  size_t key = 0;  // indexing_blocks_[key] is the key of the block at hand
  for (const AdoptedExtent& x : indexing_extents_) {
    if (!x.block) {
      if (!adoption_claims_->claim(x.offset, x.bytes)) refused.push_back(x.slot);
      continue;
    }
    const BlockIndex::Key& k = indexing_blocks_[key++];
    assert(k.slot == x.slot);
    if (duplicate(k.slot) || adoption_claims_->claim(x.offset, x.bytes)) continue;
    const bool erased = blocks_.erase(k.ns, k.hash);
    assert(erased);
    (void)erased;
    open.insert({k.ns, k.hash});
    refused.push_back(k.slot);
  }
  if (duplicates.empty()) return;
  // A later record of such a key may hold a range of its own: the first that claims
  // it takes the key. Every other duplicate goes.
  key = 0;
  for (const AdoptedExtent& x : indexing_extents_) {
    if (!x.block) continue;
    const BlockIndex::Key& k = indexing_blocks_[key++];
    if (!duplicate(k.slot)) continue;
    const auto it = open.find({k.ns, k.hash});
    if (it != open.end() && adoption_claims_->claim(x.offset, x.bytes)) {
      const bool inserted = blocks_.insert(k.ns, k.hash, k.slot);
      assert(inserted);
      (void)inserted;
      open.erase(it);
      continue;
    }
    refused.push_back(k.slot);
  }
}

void EntryTable::take_claimed_batch() {
  if (indexer_.joinable()) indexer_.join();
  if (indexing_extents_.empty()) return;
  indexing_blocks_.clear();
  indexing_extents_.clear();
  for (const EntrySlot slot : indexing_refused_) {
    // Undoes insert_adopted(); the entry was never visible to anyone, and holds no claim.
    Entry& e = slots_[slot];
    held_bytes_ -= e.extent_bytes;
    if (e.dead) {  // a reservation (insert_adopted_reservation())
      adoption_refused_.reservation_records.push_back(e.state_record);
      --held_reservations_;
      e.state_record = no_record;
      free_slot(slot);
      continue;
    }
    if (e.kind == EntryKind::Snapshot) remove_from_index(slot);
    adoption_refused_.records.push_back(e.state_record);
    adoption_refused_.bytes += e.extent_bytes;
    namespaces_[e.ns].bytes -= e.extent_bytes;  // the rest of count_sealed()
    uncount_sealed(e);
    e.state_record = no_record;
    free_slot(slot);
  }
  indexing_refused_.clear();
}

EntryTable::Refused EntryTable::finish_adoption() {
  assert(adoption_claims_);
  hand_over_adopted_batch(true);  // the last, partial batch
  take_claimed_batch();
  if (cells_writer_.joinable()) cells_writer_.join();  // nothing was adopted
  adoption_blocks_ = {};
  adoption_extents_ = {};
  indexing_blocks_ = {};
  indexing_extents_ = {};
  indexing_refused_ = {};
  allocator_.adopt(*adoption_claims_);
  adoption_claims_.reset();
  return std::exchange(adoption_refused_, {});
}

void EntryTable::release_adoption_hold() {
  for (EntrySlot slot = 0; slot < slots_.size(); ++slot) {
    Entry& e = slots_[slot];
    if (!e.adoption_hold) continue;
    e.adoption_hold = false;
    if (e.in_use && !free_if_dead_and_unused(slot)) sync_lists(slot, false);
  }
  held_bytes_ = 0;
  held_reservations_ = 0;
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
