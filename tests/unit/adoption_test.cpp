// adopt_entries, in process over a real state segment: what it keeps, what it drops
// and why, the free space it rebuilds, and the records it leaves behind.
#include "daemon/adoption.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "daemon/clock.h"
#include "daemon/entry_header.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "proto/limits.h"
#include "shm/arena_format.h"
#include "shm/state_segment.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;
constexpr uint64_t arena_bytes = 64 * granule;
constexpr uint64_t block_extent = 2 * granule;
constexpr uint32_t block_tokens = 16;
constexpr NamespaceId kept_ns{0xad0b7, 1};
constexpr NamespaceId unknown_ns{0xdead, 2};

struct Unmap {
  uint64_t bytes = 0;
  void operator()(uint8_t* p) const { munmap(p, bytes); }
};
using ArenaData = std::unique_ptr<uint8_t, Unmap>;

class AdoptionTest : public ::testing::Test {
 protected:
  void SetUp() override { create(arena_bytes); }
  // A fresh segment with one namespace, for an arena of `bytes`.
  void create(uint64_t bytes) {
    arena_bytes_ = bytes;
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(data, MAP_FAILED);
    arena_ = ArenaData(static_cast<uint8_t*>(data), Unmap{bytes});
    int err = 0;
    ASSERT_EQ(shm::StateSegment::create(
                  {.arena_identity = 7, .arena_data_bytes = bytes, .configured_arena_bytes = bytes},
                  segment_, err),
              Status::Ok);
    shm::NamespaceRecord ns{};
    ns.id = kept_ns;
    ns.block_tokens = block_tokens;
    ns.block_payload_bytes = 1024;
    segment_->write_namespace(0, ns);
  }

  static shm::StateRecordBody block_body(uint64_t key, uint64_t extent_offset,
                                         const NamespaceId& ns, uint64_t extent_bytes) {
    shm::StateRecordBody body{};
    body.namespace_id = ns;
    body.key_hash = {key, key};
    body.extent_offset = extent_offset;
    body.extent_bytes = extent_bytes;
    body.kind = static_cast<uint8_t>(EntryKind::Block);
    return body;
  }

  void write_block(uint64_t index, uint64_t key, uint64_t extent_offset,
                   const NamespaceId& ns = kept_ns, uint64_t extent_bytes = block_extent) {
    segment_->write_record(index, block_body(key, extent_offset, ns, extent_bytes), 1, 0);
  }

  // What a daemon records when it reserves a block's extent for an engine.
  void write_reservation(uint64_t index, uint64_t key, uint64_t extent_offset,
                         const NamespaceId& ns = kept_ns) {
    segment_->write_reservation(index, block_body(key, extent_offset, ns, block_extent));
  }

  // A snapshot of `tail` two blocks in, anchored at `key`: its record, and
  // the entry header and tail tokens in the arena that adoption checks it against.
  uint64_t write_snapshot(uint64_t index, uint64_t key, uint64_t extent_offset,
                          const std::vector<int32_t>& tail) {
    const uint32_t tokens = static_cast<uint32_t>(tail.size());
    const uint64_t payload_bytes = 1024;
    shm::StateRecordBody body{};
    body.namespace_id = kept_ns;
    body.key_hash = {key, key};
    body.extent_offset = extent_offset;
    body.extent_bytes = shm::extent_bytes_for(tokens, payload_bytes);
    body.tail_digest = record_tail_digest(tail);
    body.position = 2 * block_tokens + tokens;
    body.anchor_chunks = 2;
    body.tail_tokens = tokens;
    body.kind = static_cast<uint8_t>(EntryKind::Snapshot);
    Entry e;
    e.kind = EntryKind::Snapshot;
    e.key_hash = body.key_hash;
    e.position = body.position;
    e.anchor_chunks = body.anchor_chunks;
    const shm::EntryHeader h =
        make_entry_header(e, NamespaceInfo{.id = kept_ns}, tokens, payload_bytes, 7);
    std::memcpy(arena_.get() + extent_offset, &h, sizeof h);
    std::memcpy(arena_.get() + extent_offset + limits::entry_header_bytes, tail.data(),
                tail.size() * sizeof(int32_t));
    segment_->write_record(index, body, 1, 0);
    return body.extent_bytes;
  }

  // Restarts: a new segment object over the kept fd, a fresh table, adoption.
  AdoptionReport adopt() {
    table_.reset();
    state_.reset();
    std::unique_ptr<shm::StateSegment> kept;
    int err = 0;
    const int fd = dup(segment_->fd());
    EXPECT_EQ(shm::StateSegment::adopt(fd, kept, err), Status::Ok);
    segment_ = std::move(kept);
    state_ = std::make_unique<EntryState>(*segment_);
    table_ = std::make_unique<EntryTable>(arena_bytes_, granule);
    table_->set_state(state_.get());
    return adopt_entries(*state_, arena_.get(), arena_bytes_, *table_);
  }

  shm::StateSegment::RecordCheck check(uint64_t index) {
    shm::StateRecord r{};
    return segment_->check_record(index, r);
  }

  NamespaceIndex ns_index() {
    for (NamespaceIndex i = 0; i < table_->namespace_count(); ++i) {
      if (table_->namespace_info(i).id == kept_ns) return i;
    }
    ADD_FAILURE() << "namespace not adopted";
    return 0;
  }

  uint64_t arena_bytes_ = 0;
  // The data region. Adopting a block reads none of it, and the batch tests' arenas
  // run to gigabytes: only the pages a snapshot is written to are ever backed.
  ArenaData arena_;
  std::unique_ptr<shm::StateSegment> segment_;
  std::unique_ptr<EntryState> state_;
  std::unique_ptr<EntryTable> table_;
};

TEST_F(AdoptionTest, KeepsEveryValidRecordAndFreesExactlyWhatNoRecordCovers) {
  // Extents in an order unrelated to the records', with gaps, over several bitmap words.
  write_block(0, 1, 40 * granule);
  write_block(2, 2, 0);  // record 1 was never written
  write_block(3, 3, 62 * granule);
  write_block(4, 4, 10 * granule, kept_ns, 20 * granule);
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 4u);
  EXPECT_EQ(report.dropped_total(), 0u);
  EXPECT_EQ(report.bytes, 3 * block_extent + 20 * granule);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - report.bytes);
  // Free runs: [2,10) [30,40) [42,62): the largest is 20 granules.
  EXPECT_EQ(table_->largest_free_bytes(), 20 * granule);
  for (uint64_t key : {1, 2, 3, 4}) {
    EXPECT_NE(table_->find_block(ns_index(), {key, key}), no_slot) << key;
  }
  EXPECT_EQ(check(1), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(4), shm::StateSegment::RecordCheck::Valid);
}

TEST_F(AdoptionTest, DropsOverlapsDuplicatesStrayExtentsForeignNamespacesAndTornRecords) {
  write_block(0, 1, 0);                                     // kept
  write_block(1, 2, granule);                               // overlaps record 0's extent
  write_block(2, 1, 8 * granule);                           // the same key again
  write_block(3, 3, arena_bytes - granule);                 // runs past the arena
  write_block(4, 4, 16 * granule, unknown_ns);              // no such namespace
  write_block(5, 5, 20 * granule);                          // torn below
  write_block(6, 6, 30 * granule);                          // kept
  write_block(7, 7, 41 * granule, kept_ns, granule + 512);  // not on granules
  segment_->base()[segment_->records_offset() + 5 * sizeof(shm::StateRecord) + 40] ^= 1;
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 2u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 4u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Namespace)], 1u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Damaged)], 1u);
  // Only the two kept extents are allocated: a dropped record's range is free again.
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  EXPECT_NE(table_->find_block(ns_index(), {1, 1}), no_slot);
  EXPECT_EQ(table_->find_block(ns_index(), {2, 2}), no_slot);
  // Dropped records are cleared, so a second crash cannot bring them back; kept ones stay.
  for (uint64_t i : {1, 2, 3, 4, 5, 7}) {
    EXPECT_EQ(check(i), shm::StateSegment::RecordCheck::Empty) << i;
  }
  EXPECT_EQ(check(0), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(check(6), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(adopt().entries, 2u);  // and a second adoption finds the same two
}

TEST_F(AdoptionTest, ARefusedDuplicateKeyCostsNoLaterRecordItsExtent) {
  // Record 1 repeats record 0's key over another extent, which record 2 then holds
  // validly. The duplicate is refused, and takes nothing with it: record 2 is kept.
  write_block(0, 1, 0);
  write_block(1, 1, 8 * granule);
  write_block(2, 2, 8 * granule);
  write_block(3, 3, 9 * granule);  // overlaps record 2: the later record goes
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 2u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 2u);
  const EntrySlot first = table_->find_block(ns_index(), {1, 1});
  ASSERT_NE(first, no_slot);
  EXPECT_EQ(table_->entry(first).extent_offset, 0u);
  const EntrySlot second = table_->find_block(ns_index(), {2, 2});
  ASSERT_NE(second, no_slot);
  EXPECT_EQ(table_->entry(second).extent_offset, 8 * granule);
  EXPECT_EQ(table_->find_block(ns_index(), {3, 3}), no_slot);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  EXPECT_EQ(check(1), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(2), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(check(3), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(adopt().entries, 2u);
}

TEST_F(AdoptionTest, AKeyWhoseFirstRecordLosesItsExtentGoesToItsNextRecord) {
  write_block(0, 5, 0);
  write_block(1, 1, 0);             // key 1 over record 0's extent: refused
  write_block(2, 1, 8 * granule);   // key 1 again, over a range of its own: kept
  write_block(3, 1, 16 * granule);  // and once more: a duplicate of record 2
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 2u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 2u);
  const EntrySlot kept = table_->find_block(ns_index(), {1, 1});
  ASSERT_NE(kept, no_slot);
  EXPECT_EQ(table_->entry(kept).extent_offset, 8 * granule);
  EXPECT_EQ(table_->entry(kept).state_record, 2u);
  EXPECT_EQ(table_->blocks(), 2u);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  for (uint64_t i : {1, 3}) EXPECT_EQ(check(i), shm::StateSegment::RecordCheck::Empty) << i;
  EXPECT_EQ(check(2), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(adopt().entries, 2u);
}

TEST_F(AdoptionTest, AKeyAnEarlierIndexBatchHoldsIsRefusedItsExtentFreedItsRecordCleared) {
  // Blocks are indexed in batches of 65536: the copy of record 3's key sits past the
  // first batch, so it is found only when its batch goes in, and taken out again.
  constexpr uint64_t count = 65536 + 16;
  create(count * block_extent);
  for (uint64_t i = 0; i < count; ++i) write_block(i, i + 1, i * block_extent);
  const uint64_t twice = count - 5;
  write_block(twice, 4, twice * block_extent);
  segment_->write_upgrade(twice, 0, 0, true);  // pinned: the pin goes with it
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, count - 1);
  EXPECT_EQ(report.bytes, (count - 1) * block_extent);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 1u);
  EXPECT_EQ(table_->slots_in_use(), count - 1);
  EXPECT_EQ(table_->blocks(), count - 1);
  EXPECT_EQ(table_->pinned(), 0u);
  EXPECT_EQ(table_->bytes_free(), block_extent);
  EXPECT_EQ(table_->largest_free_bytes(), block_extent);  // exactly the refused extent
  const EntrySlot kept = table_->find_block(ns_index(), {4, 4});
  ASSERT_NE(kept, no_slot);
  EXPECT_EQ(table_->entry(kept).extent_offset, 3 * block_extent);
  EXPECT_EQ(check(twice), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(3), shm::StateSegment::RecordCheck::Valid);
  // Its record index is free again, the only one below the high-water mark: the next
  // entry parked takes it (in the refused extent, the only free one).
  NewEntry n{.ns = ns_index(),
             .kind = EntryKind::Block,
             .key_hash = {count + 100, 7},
             .extent_bytes = block_extent};
  EntrySlot slot = no_slot;
  ASSERT_EQ(table_->insert_reserved(n, slot), Status::Ok);
  table_->seal(slot, 0, coarse_monotonic_usec());
  EXPECT_EQ(table_->entry(slot).state_record, twice);
  EXPECT_EQ(adopt().entries, count);  // the refused record stays gone; the new one is kept
}

TEST_F(AdoptionTest, BlocksOfSeveralIndexBatchesKeepRecordOrderAcrossBatches) {
  // Four index batches of 65536 (the last partial): each is indexed and claimed on a
  // helper thread while the next is adopted. A duplicate key in a later batch
  // and a later extent overlapping an earlier batch's are refused all the same, every
  // other record is kept, and the arena holds no free byte a kept record covers.
  constexpr uint64_t count = 3 * 65536 + 5000;
  create((count + 1) * block_extent);
  // Placed back to front, so neighbouring records' extents are far apart.
  for (uint64_t i = 0; i < count; ++i) write_block(i, i + 1, (count - 1 - i) * block_extent);
  // Two records rewritten (their own blocks are gone, their extents free): one in batch
  // 3 with the key of record 10 (batch 1) on an extent of its own, one in batch 4 on
  // record 65540's extent (batch 2).
  const uint64_t duplicate = 2 * 65536 + 7;
  write_block(duplicate, 11, count * block_extent);
  const uint64_t overlap = 3 * 65536 + 9;
  write_block(overlap, count + 100, (count - 1 - 65540) * block_extent);
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, count - 2);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 2u);
  EXPECT_EQ(table_->blocks(), count - 2);
  // Free: the refused duplicate's own extent, and those of the two records overwritten.
  EXPECT_EQ(table_->bytes_free(), 3 * block_extent);
  const EntrySlot first = table_->find_block(ns_index(), {11, 11});
  ASSERT_NE(first, no_slot);
  EXPECT_EQ(table_->entry(first).extent_offset, (count - 1 - 10) * block_extent);
  const EntrySlot held = table_->find_block(ns_index(), {65541, 65541});
  ASSERT_NE(held, no_slot);
  EXPECT_EQ(table_->entry(held).extent_offset, (count - 1 - 65540) * block_extent);
  EXPECT_EQ(table_->find_block(ns_index(), {count + 100, count + 100}), no_slot);
  EXPECT_NE(table_->find_block(ns_index(), {count, count}), no_slot);
  EXPECT_EQ(check(duplicate), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(overlap), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(adopt().entries, count - 2);  // the refused records stay gone
}

TEST_F(AdoptionTest, SnapshotsClaimTheirExtentsInRecordOrderWithTheBlocks) {
  // A snapshot over an earlier block's extent is refused, and so is a block over an
  // earlier snapshot's: whichever record comes first keeps the range.
  write_block(0, 1, 0);
  write_block(1, 2, 2 * granule);
  const std::vector<int32_t> lost_tail{7, 8, 9};
  (void)write_snapshot(2, 100, 3 * granule, lost_tail);  // over block 1
  const std::vector<int32_t> kept_tail{4, 5, 6};
  const uint64_t snapshot_extent = write_snapshot(3, 101, 8 * granule, kept_tail);
  write_block(4, 3, 8 * granule);  // over snapshot 3
  write_block(5, 4, 12 * granule);
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 4u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 2u);
  EXPECT_EQ(report.dropped_total(), 2u);
  EXPECT_EQ(table_->blocks(), 3u);
  EXPECT_EQ(table_->snapshots(), 1u);
  EXPECT_EQ(table_->namespace_info(ns_index()).indexed_snapshots, 1u);
  EXPECT_EQ(table_->find_snapshot(ns_index(), {100, 100}, lost_tail), no_slot);
  const EntrySlot snapshot = table_->find_snapshot(ns_index(), {101, 101}, kept_tail);
  ASSERT_NE(snapshot, no_slot);
  EXPECT_EQ(table_->entry(snapshot).extent_offset, 8 * granule);
  EXPECT_EQ(table_->find_block(ns_index(), {3, 3}), no_slot);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 3 * block_extent - snapshot_extent);
  EXPECT_EQ(check(2), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(4), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(adopt().entries, 4u);  // the refused records stay gone
}

TEST_F(AdoptionTest, SnapshotsInABatchClaimedOnTheIndexerThreadKeepRecordOrder) {
  // Three batches of 65536 (the last partial), so the second is claimed on the helper
  // thread while the third is adopted. In it, a snapshot over record 5's extent (batch
  // 1) is refused and one on an extent of its own is kept.
  constexpr uint64_t count = 2 * 65536 + 100;
  create((count + 1) * block_extent);
  for (uint64_t i = 0; i < count; ++i) write_block(i, i + 1, i * block_extent);
  const uint64_t refused = 65536 + 3, kept = 65536 + 4;
  const std::vector<int32_t> tail{1, 2, 3};
  (void)write_snapshot(refused, 200, 5 * block_extent, tail);
  const uint64_t snapshot_extent = write_snapshot(kept, 201, count * block_extent, tail);
  ASSERT_EQ(snapshot_extent, block_extent);  // the arena holds it exactly
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, count - 1);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 1u);
  EXPECT_EQ(table_->blocks(), count - 2);
  EXPECT_EQ(table_->snapshots(), 1u);
  EXPECT_EQ(table_->namespace_info(ns_index()).indexed_snapshots, 1u);
  EXPECT_EQ(table_->find_snapshot(ns_index(), {200, 200}, tail), no_slot);
  EXPECT_NE(table_->find_snapshot(ns_index(), {201, 201}, tail), no_slot);
  const EntrySlot first = table_->find_block(ns_index(), {6, 6});
  ASSERT_NE(first, no_slot);
  EXPECT_EQ(table_->entry(first).extent_offset, 5 * block_extent);
  // Free: the extents of the two block records the snapshots took the place of.
  EXPECT_EQ(table_->bytes_free(), 2 * block_extent);
  EXPECT_EQ(check(refused), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(kept), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(adopt().entries, count - 1);
}

TEST_F(AdoptionTest, ASnapshotWhoseTailWouldRunPastItsExtentIsDroppedBeforeAnyRead) {
  // A namespace of long blocks, so a tail can be longer than the smallest extent; the
  // record's snapshot sits in the arena's last granule, and its header's payload size
  // wraps the extent size check. Reading its tail would run past the arena's end.
  constexpr uint32_t long_block_tokens = 4096;
  constexpr uint32_t tail_tokens = long_block_tokens - 1;
  shm::NamespaceRecord ns{};
  ns.id = unknown_ns;
  ns.block_tokens = long_block_tokens;
  ns.block_payload_bytes = 1024;
  segment_->write_namespace(1, ns);
  const uint64_t extent_offset = arena_bytes - granule;
  const uint32_t payload_offset = shm::payload_offset_for(tail_tokens);
  ASSERT_GT(payload_offset, granule);
  shm::StateRecordBody body{};
  body.namespace_id = unknown_ns;
  body.key_hash = {300, 300};
  body.extent_offset = extent_offset;
  body.extent_bytes = granule;
  body.position = long_block_tokens + tail_tokens;
  body.anchor_chunks = 1;
  body.tail_tokens = tail_tokens;
  body.kind = static_cast<uint8_t>(EntryKind::Snapshot);
  segment_->write_record(0, body, 1, 0);
  Entry e;
  e.kind = EntryKind::Snapshot;
  e.key_hash = body.key_hash;
  e.position = body.position;
  e.anchor_chunks = body.anchor_chunks;
  const uint64_t wrapping_payload_bytes = 0 - uint64_t{payload_offset} + granule;
  ASSERT_EQ(shm::extent_bytes_for(tail_tokens, wrapping_payload_bytes), granule);
  const shm::EntryHeader h =
      make_entry_header(e, NamespaceInfo{.id = unknown_ns}, tail_tokens, wrapping_payload_bytes, 7);
  std::memcpy(arena_.get() + extent_offset, &h, sizeof h);
  write_block(1, 1, 0);
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 1u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Header)], 1u);
  EXPECT_EQ(report.dropped_total(), 1u);
}

// An engine may still be writing into an extent reserved when the daemon died: it is
// neither free nor an entry until the adoption hold ends, and then it is both freed
// and forgotten by the state segment.
TEST_F(AdoptionTest, AReservedExtentIsHeldUnindexedUntilTheHoldEndsThenFreedAndItsRecordCleared) {
  write_block(0, 1, 0);
  write_reservation(1, 2, 4 * granule);
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 1u);
  EXPECT_EQ(report.bytes, block_extent);
  EXPECT_EQ(report.reservations, 1u);
  EXPECT_EQ(report.reservation_bytes, block_extent);
  EXPECT_EQ(report.dropped_total(), 0u);
  EXPECT_NE(report.summary().find("holding 1 extents"), std::string::npos) << report.summary();
  EXPECT_EQ(table_->find_block(ns_index(), {2, 2}), no_slot);  // never served
  EXPECT_EQ(table_->blocks(), 1u);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  EXPECT_EQ(table_->held_reservations(), 1u);
  EXPECT_EQ(check(1), shm::StateSegment::RecordCheck::Reservation);  // a second crash holds it too

  table_->release_adoption_hold();
  EXPECT_EQ(table_->bytes_free(), arena_bytes - block_extent);
  EXPECT_EQ(table_->held_reservations(), 0u);
  EXPECT_EQ(check(1), shm::StateSegment::RecordCheck::Empty);
  EXPECT_EQ(check(0), shm::StateSegment::RecordCheck::Valid);
  // Its record index is free for the next entry.
  NewEntry n{
      .ns = ns_index(), .kind = EntryKind::Block, .key_hash = {9, 9}, .extent_bytes = block_extent};
  EntrySlot slot = no_slot;
  ASSERT_EQ(table_->insert_reserved(n, slot), Status::Ok);
  EXPECT_EQ(table_->entry(slot).state_record, 1u);
}

TEST_F(AdoptionTest, AReservationOverlappingAKeptEntryOrOutsideTheArenaIsDroppedNotHeld) {
  write_block(0, 1, 0);
  write_reservation(1, 2, granule);      // overlaps record 0's extent
  write_reservation(2, 3, arena_bytes);  // outside the arena
  write_reservation(3, 4, 8 * granule, unknown_ns);
  write_reservation(4, 5, 12 * granule);  // held
  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 1u);
  EXPECT_EQ(report.reservations, 1u);
  EXPECT_EQ(report.reservation_bytes, block_extent);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Extent)], 2u);
  EXPECT_EQ(report.dropped[static_cast<size_t>(DropReason::Namespace)], 1u);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  for (uint64_t i : {1, 2, 3}) EXPECT_EQ(check(i), shm::StateSegment::RecordCheck::Empty) << i;
  EXPECT_EQ(check(4), shm::StateSegment::RecordCheck::Reservation);
}

// The records a running daemon keeps for reservations: written before the engine may
// write, rewritten in place at seal, cleared when aborted, and left for the next
// instance when a planned stop ends the reservation.
TEST_F(AdoptionTest, AReservationIsRecordedBeforeAnyWriteSealedInPlaceAndKeptAcrossAPlannedStop) {
  adopt();  // an empty table over the segment, its namespace registered
  auto reserve = [&](uint64_t key) {
    NewEntry n{.ns = ns_index(),
               .kind = EntryKind::Block,
               .key_hash = {key, key},
               .extent_bytes = block_extent};
    EntrySlot slot = no_slot;
    EXPECT_EQ(table_->insert_reserved(n, slot), Status::Ok);
    return slot;
  };
  const EntrySlot sealed = reserve(1);
  const uint32_t sealed_record = table_->entry(sealed).state_record;
  ASSERT_NE(sealed_record, no_record);
  EXPECT_EQ(check(sealed_record), shm::StateSegment::RecordCheck::Reservation);
  table_->seal(sealed, 0x77, coarse_monotonic_usec());
  EXPECT_EQ(table_->entry(sealed).state_record, sealed_record);
  shm::StateRecord r{};
  ASSERT_EQ(segment_->check_record(sealed_record, r), shm::StateSegment::RecordCheck::Valid);
  EXPECT_EQ(r.body.payload_checksum, 0x77u);

  const EntrySlot aborted = reserve(2);
  const uint32_t aborted_record = table_->entry(aborted).state_record;
  table_->erase(aborted);
  EXPECT_EQ(check(aborted_record), shm::StateSegment::RecordCheck::Empty);

  const EntrySlot open = reserve(3);
  const uint32_t open_record = table_->entry(open).state_record;
  state_->freeze();  // a planned stop closes the connection: the engine may still write
  table_->erase(open);
  EXPECT_EQ(check(open_record), shm::StateSegment::RecordCheck::Reservation);

  const AdoptionReport report = adopt();
  EXPECT_EQ(report.entries, 1u);
  EXPECT_EQ(report.reservations, 1u);
  EXPECT_EQ(table_->bytes_free(), arena_bytes - 2 * block_extent);
  table_->release_adoption_hold();
  EXPECT_EQ(table_->bytes_free(), arena_bytes - block_extent);
}

}  // namespace
}  // namespace kvpark::daemon
