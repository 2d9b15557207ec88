// EntryTable: dedup by key, LRU eviction order, leases and pins keep entries,
// a request that can never fit costs no parked state, and disk eviction never
// leaves a record behind a missing one.
#include "daemon/entry_table.h"

#include <gtest/gtest.h>

#include "daemon/clock.h"
#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;

class EntryTableTest : public ::testing::Test {
 protected:
  explicit EntryTableTest(uint64_t granules = 8) : table_(granules * granule, granule) {
    EXPECT_EQ(table_.register_namespace({1, 1}, {.block_tokens = 16, .block_payload_bytes = 1024},
                                        0, ns_),
              Status::Ok);
  }
  EntrySlot insert(uint64_t key, uint64_t granules = 1, Status expected = Status::Ok) {
    EntrySlot slot = no_slot;
    NewEntry n{.ns = ns_, .kind = EntryKind::Block, .key_hash = {key, 0},
               .extent_bytes = granules * granule};
    EXPECT_EQ(table_.insert_reserved(n, slot), expected) << "key " << key;
    return slot;
  }
  EntrySlot insert_sealed(uint64_t key, uint64_t granules = 1) {
    EntrySlot slot = insert(key, granules);
    if (slot != no_slot) table_.seal(slot, 0, coarse_monotonic_usec());
    return slot;
  }
  bool present(uint64_t key) const { return table_.find_block(ns_, {key, 0}) != no_slot; }
  // A sealed block `index` of a chain of keys first..first+index, with a disk record.
  EntrySlot block_on_disk(uint64_t first, uint32_t index) {
    EntrySlot slot = no_slot;
    NewEntry n{.ns = ns_, .kind = EntryKind::Block, .key_hash = {first + index, 0},
               .parent_hash = {index == 0 ? 0 : first + index - 1, 0}, .extent_bytes = granule,
               .anchor_chunks = index};
    EXPECT_EQ(table_.insert_reserved(n, slot), Status::Ok);
    table_.seal(slot, 0, coarse_monotonic_usec());
    table_.attach_disk_record(slot, granule);
    return slot;
  }

  EntryTable table_;
  NamespaceIndex ns_ = 0;
};

TEST_F(EntryTableTest, FindsReservedAndSealedBlocksByKey) {
  EXPECT_EQ(table_.find_block(ns_, {1, 0}), no_slot);
  const EntrySlot slot = insert(1);
  EXPECT_EQ(table_.find_block(ns_, {1, 0}), slot);
  EXPECT_FALSE(table_.entry(slot).sealed);
  EXPECT_EQ(table_.blocks(), 0u) << "reserved entries are not counted as parked";
  table_.seal(slot, 0, coarse_monotonic_usec());
  EXPECT_TRUE(table_.entry(slot).sealed);
  EXPECT_EQ(table_.blocks(), 1u);
  EXPECT_EQ(table_.evictable_bytes(), granule);
}

TEST_F(EntryTableTest, KeysAreScopedByNamespace) {
  NamespaceIndex other = 0;
  ASSERT_EQ(table_.register_namespace({2, 2}, {.block_tokens = 16, .block_payload_bytes = 1024}, 0,
                                      other),
            Status::Ok);
  ASSERT_NE(other, ns_);
  insert_sealed(5);
  EXPECT_NE(table_.find_block(ns_, {5, 0}), no_slot);
  EXPECT_EQ(table_.find_block(other, {5, 0}), no_slot);
}

TEST_F(EntryTableTest, RegisteringKnownNamespaceChecksGeometry) {
  NamespaceIndex again = 99;
  EXPECT_EQ(table_.register_namespace({1, 1}, {.block_tokens = 16, .block_payload_bytes = 1024}, 0,
                                      again),
            Status::Ok);
  EXPECT_EQ(again, ns_);
  EXPECT_EQ(table_.register_namespace({1, 1}, {.block_tokens = 32, .block_payload_bytes = 1024}, 0,
                                      again),
            Status::GeometryMismatch);
  EXPECT_EQ(table_.namespace_count(), 1u);
}

TEST_F(EntryTableTest, RejectsInvalidGeometry) {
  NamespaceIndex ns = 0;
  EXPECT_EQ(table_.register_namespace({9, 0}, {.block_tokens = limits::block_tokens_max + 1,
                                               .block_payload_bytes = 1},
                                      0, ns),
            Status::InvalidArgument);
  EXPECT_EQ(table_.register_namespace({9, 1}, {.block_tokens = 16, .block_payload_bytes = 0}, 0, ns),
            Status::InvalidArgument);
  EXPECT_EQ(table_.register_namespace({9, 2}, {.block_tokens = 0, .block_payload_bytes = 0,
                                               .snapshot_required = false},
                                      0, ns),
            Status::InvalidArgument)
      << "snapshot-only namespaces must require snapshots";
  EXPECT_EQ(table_.register_namespace({9, 3}, {.block_tokens = 0, .block_payload_bytes = 0,
                                               .snapshot_required = true},
                                      0, ns),
            Status::Ok);
  EXPECT_EQ(table_.namespace_info(ns).chain_tokens, limits::snapshot_chain_tokens);
}

TEST_F(EntryTableTest, EvictsLeastRecentlyUsedFirst) {
  for (uint64_t k = 1; k <= 8; ++k) insert_sealed(k);
  table_.touch(table_.find_block(ns_, {1, 0}));  // 1 becomes the most recent
  insert_sealed(100);
  EXPECT_TRUE(present(1));
  EXPECT_FALSE(present(2)) << "2 is now the oldest";
  insert_sealed(101);
  EXPECT_FALSE(present(3));
  EXPECT_TRUE(present(4));
  EXPECT_EQ(table_.evictions(), 2u);
}

TEST_F(EntryTableTest, LeasedEntriesAreNeverEvicted) {
  for (uint64_t k = 1; k <= 8; ++k) insert_sealed(k);
  const EntrySlot oldest = table_.find_block(ns_, {1, 0});
  table_.acquire_lease(oldest);
  EXPECT_EQ(table_.evictable_bytes(), 7 * granule);
  insert_sealed(100);
  EXPECT_TRUE(present(1));
  EXPECT_FALSE(present(2));
  table_.release_lease(oldest);
  EXPECT_EQ(table_.evictable_bytes(), 8 * granule);
  insert_sealed(101);
  EXPECT_TRUE(present(1)) << "a released lease makes the entry most recent";
  EXPECT_FALSE(present(3));
}

TEST_F(EntryTableTest, ReservedEntriesAreNeverEvicted) {
  for (uint64_t k = 1; k <= 8; ++k) insert(k);  // reserved, not sealed
  EXPECT_EQ(table_.evictable_bytes(), 0u);
  insert(100, 1, Status::ArenaFull);
  for (uint64_t k = 1; k <= 8; ++k) EXPECT_TRUE(present(k));
}

TEST_F(EntryTableTest, ArenaFullWhenEverythingIsLeased) {
  for (uint64_t k = 1; k <= 8; ++k) table_.acquire_lease(insert_sealed(k));
  insert(100, 1, Status::ArenaFull);
  EXPECT_EQ(table_.evictions(), 0u);
  for (uint64_t k = 1; k <= 8; ++k) EXPECT_TRUE(present(k));
}

TEST_F(EntryTableTest, RequestThatCanNeverFitEvictsNothing) {
  for (uint64_t k = 1; k <= 4; ++k) insert_sealed(k);
  table_.acquire_lease(table_.find_block(ns_, {1, 0}));
  // 4 free + 3 evictable granules: a 8-granule request can never fit.
  EXPECT_EQ(insert(100, 8, Status::ArenaFull), no_slot);
  EXPECT_EQ(table_.evictions(), 0u);
  for (uint64_t k = 1; k <= 4; ++k) EXPECT_TRUE(present(k));
  EXPECT_EQ(table_.bytes_free(), 4 * granule);
  // 7 granules can: it takes the free space plus the evictable entries.
  EXPECT_NE(insert(101, 7), no_slot);
  EXPECT_EQ(table_.evictions(), 3u);
  EXPECT_TRUE(present(1));
}

TEST_F(EntryTableTest, EvictsUntilAContiguousRunFits) {
  for (uint64_t k = 1; k <= 8; ++k) insert_sealed(k);
  // Free every other granule: 4 granules free but no two adjacent.
  for (uint64_t k = 2; k <= 8; k += 2) table_.erase(table_.find_block(ns_, {k, 0}));
  EXPECT_EQ(table_.bytes_free(), 4 * granule);
  EXPECT_EQ(table_.largest_free_bytes(), granule);
  EXPECT_NE(insert(100, 2), no_slot);
  EXPECT_FALSE(present(1)) << "the oldest entry was evicted to join two holes";
  EXPECT_TRUE(present(3));
  EXPECT_EQ(table_.evictions(), 1u);
}

// A large extent on a fragmented arena whose LRU order runs against the offsets: the
// cheapest stretch goes (here, of the fewest bytes), at most the need plus one entry,
// where evicting in LRU order until some run fits would empty half the arena.
class EntryTableLargeTest : public EntryTableTest {
 protected:
  EntryTableLargeTest() : EntryTableTest(64) {}
};

TEST_F(EntryTableLargeTest, ALargeExtentEvictsOnlyWhatItNeeds) {
  for (uint64_t k = 0; k < 64; ++k) insert_sealed(k);
  for (uint64_t k = 1; k < 64; k += 2) table_.erase(table_.find_block(ns_, {k, 0}));
  // Most recent first from the low offsets: the LRU tail is the highest offset.
  for (uint64_t k = 0; k < 64; k += 2) table_.touch(table_.find_block(ns_, {k, 0}));
  ASSERT_EQ(table_.bytes_free(), 32 * granule);
  ASSERT_EQ(table_.largest_free_bytes(), granule);
  const uint64_t free_before = table_.bytes_free();
  ASSERT_NE(insert(1000, 8), no_slot);
  const uint64_t freed = table_.room_eviction_bytes();
  EXPECT_LE(freed, 8 * granule + granule) << "at most the need plus one entry";
  EXPECT_EQ(freed, 4 * granule) << "four entries between four holes";
  EXPECT_EQ(table_.evictions(), 4u);
  EXPECT_EQ(table_.run_evictions(), 4u);
  EXPECT_EQ(table_.bytes_free(), free_before + freed - 8 * granule);
}

TEST_F(EntryTableLargeTest, AStretchOfLowValueGoesBeforeOneOfHighValue) {
  for (uint64_t k = 0; k < 64; ++k) insert_sealed(k);
  for (uint64_t k = 1; k < 64; k += 2) table_.erase(table_.find_block(ns_, {k, 0}));
  // Keys below 32 are worth a lot; the stretch taken lies above them.
  table_.set_host_eviction_cost([](const EntryTable& t, EntrySlot slot) {
    return t.entry(slot).key_hash.low < 32 ? 1000.0 : 1.0;
  });
  ASSERT_NE(insert(1000, 4), no_slot);
  for (uint64_t k = 0; k < 32; k += 2) EXPECT_TRUE(present(k)) << k;
  EXPECT_EQ(table_.evictions(), 2u);
}

TEST_F(EntryTableTest, EraseReturnsBytesAndSlots) {
  const EntrySlot a = insert(1, 3);
  const EntrySlot b = insert_sealed(2, 2);
  EXPECT_EQ(table_.bytes_free(), 3 * granule);
  EXPECT_EQ(table_.slots_in_use(), 2u);
  table_.erase(a);
  table_.erase(b);
  EXPECT_EQ(table_.bytes_free(), 8 * granule);
  EXPECT_EQ(table_.slots_in_use(), 0u);
  EXPECT_EQ(table_.blocks(), 0u);
  EXPECT_EQ(table_.evictable_bytes(), 0u);
  EXPECT_EQ(table_.namespace_info(ns_).bytes, 0u);
  EXPECT_FALSE(present(1));
  EXPECT_FALSE(present(2));
}

TEST_F(EntryTableTest, DiskEvictionTakesAChainFromItsTip) {
  // Written root first, so plain LRU would take the root and strand the rest.
  const EntrySlot chain[3] = {block_on_disk(10, 0), block_on_disk(10, 1), block_on_disk(10, 2)};
  const EntrySlot other = block_on_disk(20, 0);  // written last: the most recent
  EXPECT_EQ(table_.disk_lru_tail(), chain[2]) << "only a chain's tip is evictable";
  EXPECT_TRUE(table_.detach_disk_record(chain[2]));
  EXPECT_EQ(table_.disk_lru_tail(), chain[1]) << "the new tip takes the cold end";
  EXPECT_TRUE(table_.detach_disk_record(chain[1]));
  EXPECT_EQ(table_.disk_lru_tail(), chain[0]);
  EXPECT_TRUE(table_.detach_disk_record(chain[0]));
  EXPECT_EQ(table_.disk_lru_tail(), other);
}

TEST_F(EntryTableTest, ARecordBeingWrittenHoldsItsPredecessorUntilItsSpillFails) {
  const EntrySlot root = block_on_disk(10, 0);
  EntrySlot next = no_slot;
  NewEntry n{.ns = ns_, .kind = EntryKind::Block, .key_hash = {11, 0}, .parent_hash = {10, 0},
             .extent_bytes = granule, .anchor_chunks = 1};
  ASSERT_EQ(table_.insert_reserved(n, next), Status::Ok);
  table_.seal(next, 0, coarse_monotonic_usec());
  table_.pin_io(next);
  table_.hold_disk_predecessor(next);
  EXPECT_EQ(table_.disk_lru_tail(), no_slot) << "the root's record is held by the write";
  table_.release_disk_predecessor(next);  // the spill failed
  table_.unpin_io(next);
  EXPECT_EQ(table_.disk_lru_tail(), root);
}

TEST_F(EntryTableTest, AHoldOnAFreedPredecessorIsDroppedNotMovedToItsSlotsNextEntry) {
  const EntrySlot root = block_on_disk(10, 0);
  const EntrySlot next = block_on_disk(10, 1);
  table_.erase(root);  // an operator's eviction: the record behind it is stranded
  const EntrySlot reused = block_on_disk(30, 0);
  ASSERT_EQ(reused, root) << "the freed slot is reused";
  EXPECT_TRUE(table_.detach_disk_record(next));
  EXPECT_EQ(table_.entry(reused).disk_dependents, 0u);
  EXPECT_EQ(table_.disk_lru_tail(), reused);
}

TEST_F(EntryTableTest, SnapshotsAreKeyedByAnchorAndExactTail) {
  const std::vector<int32_t> tail_a = {1, 2, 3}, tail_b = {1, 2, 4};
  NewEntry n{.ns = ns_, .kind = EntryKind::Snapshot, .key_hash = {7, 7}, .tail_tokens = tail_a,
             .extent_bytes = granule, .position = 19, .anchor_chunks = 1};
  EntrySlot a = no_slot, b = no_slot;
  ASSERT_EQ(table_.insert_reserved(n, a), Status::Ok);
  n.tail_tokens = tail_b;
  ASSERT_EQ(table_.insert_reserved(n, b), Status::Ok);
  EXPECT_EQ(table_.find_snapshot(ns_, {7, 7}, tail_a), a);
  EXPECT_EQ(table_.find_snapshot(ns_, {7, 7}, tail_b), b);
  EXPECT_EQ(table_.find_snapshot(ns_, {7, 7}, std::vector<int32_t>{1, 2}), no_slot);
  EXPECT_EQ(table_.find_snapshot(ns_, {7, 8}, tail_a), no_slot);
  EXPECT_EQ(table_.snapshots_at(ns_, {7, 7}).size(), 2u);
  table_.seal(a, 0, coarse_monotonic_usec());
  EXPECT_EQ(table_.snapshots(), 1u);
  table_.erase(a);
  table_.erase(b);
  EXPECT_TRUE(table_.snapshots_at(ns_, {7, 7}).empty());
}

// A full namespace table: a new namespace takes the first index that holds no entry of
// any kind (reserved, sealed, dead under a lease, disk-only) and that the caller does not
// name; the old namespace is forgotten, every other keeps its entries.
TEST(EntryTableNamespaces, AFullTableReusesOnlyAnIndexThatHoldsNothing) {
  const uint64_t n = limits::namespaces_max;
  EntryTable table(2 * n * granule, granule);
  const Geometry g{.block_tokens = 16, .block_payload_bytes = 1024};
  std::vector<EntrySlot> slots;
  for (uint64_t i = 0; i < n; ++i) {
    NamespaceIndex ns = 0;
    ASSERT_EQ(table.register_namespace({i, 7}, g, 0, ns), Status::Ok);
    ASSERT_EQ(ns, i);
    EntrySlot slot = no_slot;
    if (i == 2) {  // disk-only
      ASSERT_EQ(
          table.insert_on_disk(
              {.ns = ns, .kind = EntryKind::Block, .key_hash = {i, 1}, .extent_bytes = granule},
              granule, slot),
          Status::Ok);
    } else {
      ASSERT_EQ(
          table.insert_reserved(
              {.ns = ns, .kind = EntryKind::Block, .key_hash = {i, 1}, .extent_bytes = granule},
              slot),
          Status::Ok);
      if (i != 1) table.seal(slot, 0, coarse_monotonic_usec());  // 1 stays reserved
    }
    slots.push_back(slot);
  }
  NamespaceIndex ns = 99;
  EXPECT_EQ(table.register_namespace({n, 7}, g, 0, ns, [](NamespaceIndex) { return false; }),
            Status::LimitExceeded)
      << "every namespace holds an entry";
  // 3's entry dies under a lease: still held. 4's goes, but the caller names 4.
  table.acquire_lease(slots[3]);
  table.kill(slots[3]);
  table.erase(slots[4]);
  const auto names_4 = [](NamespaceIndex i) { return i == 4; };
  EXPECT_EQ(table.register_namespace({n, 7}, g, 0, ns, names_4), Status::LimitExceeded);
  EXPECT_EQ(table.register_namespace({n, 7}, g, 0, ns), Status::LimitExceeded)
      << "without the caller's word, no index is reused";
  // The lease ends: 3 holds nothing now and is the first such index.
  table.release_lease(slots[3]);
  ASSERT_EQ(table.register_namespace({n, 7}, {.block_tokens = 32, .block_payload_bytes = 512}, 0,
                                     ns, names_4),
            Status::Ok);
  EXPECT_EQ(ns, 3u);
  EXPECT_EQ(table.namespace_info(3).id, (NamespaceId{n, 7}));
  EXPECT_EQ(table.namespace_info(3).geometry.block_tokens, 32u) << "the new namespace's geometry";
  EXPECT_EQ(table.namespace_info(3).blocks, 0u);
  EXPECT_EQ(table.namespace_count(), n);
  EXPECT_EQ(table.namespaces_reused(), 1u);
  EXPECT_EQ(table.find_block(3, {3, 1}), no_slot);
  // The namespace that had 3 is forgotten: registering it again is a new one, which takes
  // 4 (the connection that registered the namespace at 3 names it now).
  const auto names_3 = [](NamespaceIndex i) { return i == 3; };
  EXPECT_EQ(table.register_namespace({3, 7}, g, 0, ns, names_3), Status::Ok);
  EXPECT_EQ(ns, 4u);
  const auto names_3_4 = [](NamespaceIndex i) { return i == 3 || i == 4; };
  EXPECT_EQ(table.register_namespace({5, 7}, g, 0, ns, names_3_4), Status::Ok)
      << "a known namespace is found, not registered";
  EXPECT_EQ(ns, 5u);
  EXPECT_EQ(table.register_namespace({n + 1, 7}, g, 0, ns, names_3_4), Status::LimitExceeded);
  // Every other namespace keeps its entry.
  EXPECT_EQ(table.find_block(1, {1, 1}), slots[1]);
  EXPECT_EQ(table.find_block(2, {2, 1}), slots[2]);
  EXPECT_EQ(table.find_block(5, {5, 1}), slots[5]);
  EXPECT_EQ(table.find_block(n - 1, {n - 1, 1}), slots[n - 1]);
}

}  // namespace
}  // namespace kvpark::daemon
