// Adoption into an empty entry table (see entry_table.h, "Adoption"): the entries an
// earlier daemon left are indexed in batches, each batch's block keys inserted and its
// extents claimed on a helper thread while the next batch is read, and the block
// index's empty cells written on another while the first is.
#include <algorithm>
#include <cassert>
#include <system_error>
#include <unordered_set>
#include <utility>

#include "daemon/entry_table.h"

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

}  // namespace kvpark::daemon
