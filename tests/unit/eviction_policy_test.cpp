// Host eviction policy: of the coldest eviction_sample_entries host-evictable
// entries, the least valuable goes; the entry table evicts through it once set.
#include "daemon/eviction_policy.h"

#include <gtest/gtest.h>

#include "daemon/clock.h"
#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;

class EvictionPolicyTest : public ::testing::Test {
 protected:
  EvictionPolicyTest() : table_(32 * granule, granule) {
    EXPECT_EQ(table_.register_namespace({1, 1}, {.block_tokens = 16, .block_payload_bytes = 1024},
                                        0, ns_),
              Status::Ok);
  }
  // Sealed, all at one instant so that only class decides their value.
  EntrySlot insert_sealed(uint64_t key, EntryClass entry_class) {
    EntrySlot slot = no_slot;
    NewEntry n{.ns = ns_, .kind = EntryKind::Block, .key_hash = {key, 0},
               .extent_bytes = granule, .entry_class = entry_class};
    EXPECT_EQ(table_.insert_reserved(n, slot), Status::Ok) << "key " << key;
    table_.seal(slot, 0, now_);
    return slot;
  }
  // `count` shared entries, oldest first, with one private one `private_rank`
  // places from the cold end (1: the coldest); returns the private one's slot.
  EntrySlot fill(size_t count, size_t private_rank) {
    EntrySlot private_slot = no_slot;
    for (size_t rank = 1; rank <= count; ++rank) {
      const bool is_private = rank == private_rank;
      const EntrySlot slot =
          insert_sealed(rank, is_private ? EntryClass::Private : EntryClass::Shared);
      if (is_private) private_slot = slot;
    }
    return private_slot;
  }

  EntryTable table_;
  NamespaceIndex ns_ = 0;
  uint64_t now_ = coarse_monotonic_usec();
};

TEST_F(EvictionPolicyTest, NothingEvictableIsNoSlot) {
  EXPECT_EQ(least_valuable_of_coldest(table_), no_slot);
}

TEST_F(EvictionPolicyTest, TakesTheLeastValuableOfTheColdest) {
  const EntrySlot private_slot = fill(3, 2);
  EXPECT_EQ(least_valuable_of_coldest(table_), private_slot);
}

TEST_F(EvictionPolicyTest, OfEqualValueTakesTheColdest) {
  fill(3, 0);
  EXPECT_EQ(least_valuable_of_coldest(table_), table_.host_lru_tail());
}

TEST_F(EvictionPolicyTest, SampleReachesTheLastOfItsEntries) {
  const EntrySlot private_slot = fill(eviction_sample_entries + 1, eviction_sample_entries);
  EXPECT_EQ(least_valuable_of_coldest(table_), private_slot);
}

TEST_F(EvictionPolicyTest, SampleLooksNoFurther) {
  fill(eviction_sample_entries + 1, eviction_sample_entries + 1);
  EXPECT_EQ(least_valuable_of_coldest(table_), table_.host_lru_tail());
}

TEST_F(EvictionPolicyTest, TableEvictsThroughThePolicyOnceSet) {
  fill(3, 2);
  table_.set_host_victim_policy(&least_valuable_of_coldest);
  ASSERT_TRUE(table_.evict_lru());
  EXPECT_EQ(table_.find_block(ns_, {2, 0}), no_slot) << "the private entry goes";
  EXPECT_NE(table_.find_block(ns_, {1, 0}), no_slot) << "the colder shared one stays";
}

TEST_F(EvictionPolicyTest, TableWithoutAPolicyEvictsTheColdest) {
  fill(3, 2);
  ASSERT_TRUE(table_.evict_lru());
  EXPECT_EQ(table_.find_block(ns_, {1, 0}), no_slot);
  EXPECT_NE(table_.find_block(ns_, {2, 0}), no_slot);
}

}  // namespace
}  // namespace kvpark::daemon
