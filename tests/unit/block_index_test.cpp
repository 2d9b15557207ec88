// The block index: finds what was inserted under (namespace, hash) and nothing else,
// refuses a duplicate, keeps every key reachable through deletions in the middle of a
// probe run (backward shift), grows, agrees with a plain map through long churn, and
// a batch insert keeps the first of each key, by position, whatever order it writes in.
#include "daemon/block_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <utility>
#include <vector>

namespace kvpark::daemon {
namespace {

TEST(BlockIndex, AnEmptyIndexFindsNothing) {
  BlockIndex index;
  EXPECT_EQ(index.find(0, {1, 2}), no_slot);
  EXPECT_FALSE(index.erase(0, {1, 2}));
  EXPECT_FALSE(index.assign(0, {1, 2}, 5));
  EXPECT_EQ(index.size(), 0u);
}

TEST(BlockIndex, TheSameHashInAnotherNamespaceIsAnotherKey) {
  BlockIndex index;
  ASSERT_TRUE(index.insert(1, {7, 7}, 10));
  ASSERT_TRUE(index.insert(2, {7, 7}, 20));
  EXPECT_EQ(index.find(1, {7, 7}), 10u);
  EXPECT_EQ(index.find(2, {7, 7}), 20u);
  EXPECT_EQ(index.find(3, {7, 7}), no_slot);
  EXPECT_EQ(index.find(1, {7, 8}), no_slot);
}

TEST(BlockIndex, ADuplicateInsertChangesNothing) {
  BlockIndex index;
  ASSERT_TRUE(index.insert(1, {3, 4}, 10));
  EXPECT_FALSE(index.insert(1, {3, 4}, 11));
  EXPECT_EQ(index.find(1, {3, 4}), 10u);
  EXPECT_EQ(index.size(), 1u);
  EXPECT_TRUE(index.assign(1, {3, 4}, 12));
  EXPECT_EQ(index.find(1, {3, 4}), 12u);
}

TEST(BlockIndex, ABatchKeepsTheFirstOfEachKeyAndRefusesTheRestAndWhatIsThere) {
  BlockIndex index;
  ASSERT_TRUE(index.insert(1, {500, 500}, 9000));  // indexed before the batch
  std::vector<BlockIndex::Key> keys;
  std::mt19937_64 random(12);
  for (EntrySlot slot = 0; slot < 20000; ++slot) keys.push_back({{random(), random()}, 1, slot});
  // Given twice: the later copies (by position) are refused, wherever their cells lie.
  for (EntrySlot twice : {17u, 4000u, 19999u}) keys.push_back({keys[twice].hash, 1, 30000 + twice});
  keys.push_back({{500, 500}, 1, 40000});
  keys.push_back({keys[17].hash, 2, 50000});  // the same hash in another namespace
  std::vector<EntrySlot> refused;
  index.insert_batch(keys, refused);
  std::sort(refused.begin(), refused.end());
  EXPECT_EQ(refused, (std::vector<EntrySlot>{30017, 34000, 40000, 49999}));
  EXPECT_EQ(index.size(), 1 + 20000 + 1u);
  for (EntrySlot slot = 0; slot < 20000; ++slot) {
    ASSERT_EQ(index.find(1, keys[slot].hash), slot) << slot;
  }
  EXPECT_EQ(index.find(1, {500, 500}), 9000u);
  EXPECT_EQ(index.find(2, keys[17].hash), 50000u);
  // Still an ordinary index afterwards.
  EXPECT_TRUE(index.erase(1, keys[17].hash));
  EXPECT_EQ(index.find(1, keys[17].hash), no_slot);
  EXPECT_EQ(index.find(2, keys[17].hash), 50000u);
}

TEST(BlockIndex, GrowsPastItsReservationAndKeepsEveryKey) {
  BlockIndex index;
  index.reserve(100);
  const size_t reserved = index.capacity();
  EXPECT_GE(reserved, 200u);
  for (uint32_t i = 0; i < 10'000; ++i) ASSERT_TRUE(index.insert(0, {i, ~uint64_t{i}}, i));
  EXPECT_GT(index.capacity(), reserved);
  EXPECT_LE(index.size() * 2, index.capacity());  // load at most 1/2
  for (uint32_t i = 0; i < 10'000; ++i) ASSERT_EQ(index.find(0, {i, ~uint64_t{i}}), i);
}

TEST(BlockIndex, DeletingEveryOtherKeyOfAFullRunLeavesTheRestReachable) {
  // A small table at its full load has long runs: deletions shift later keys back.
  BlockIndex index;
  constexpr uint32_t keys = 8;  // 16 cells, the smallest table, at load 1/2
  for (uint32_t i = 0; i < keys; ++i) ASSERT_TRUE(index.insert(0, {i * 0x1000ull, 0}, i));
  ASSERT_EQ(index.capacity(), 16u);
  for (uint32_t i = 0; i < keys; i += 2) ASSERT_TRUE(index.erase(0, {i * 0x1000ull, 0}));
  for (uint32_t i = 0; i < keys; ++i) {
    EXPECT_EQ(index.find(0, {i * 0x1000ull, 0}), i % 2 == 0 ? no_slot : i) << i;
  }
  EXPECT_EQ(index.size(), keys / 2);
}

TEST(BlockIndex, AgreesWithAPlainMapThroughChurn) {
  BlockIndex index;
  std::map<std::pair<uint32_t, uint64_t>, uint32_t> reference;
  std::mt19937_64 rng(20261202);
  for (uint32_t round = 0; round < 300'000; ++round) {
    const uint32_t ns = static_cast<uint32_t>(rng() % 3);
    const uint64_t key = rng() % 20'000;
    const Hash128 hash{key, key * 31};
    switch (rng() % 4) {
      case 0:
        ASSERT_EQ(index.erase(ns, hash), reference.erase({ns, key}) == 1);
        break;
      case 1:
        ASSERT_EQ(index.assign(ns, hash, round), reference.count({ns, key}) == 1);
        if (reference.count({ns, key})) reference[{ns, key}] = round;
        break;
      default:
        ASSERT_EQ(index.insert(ns, hash, round), reference.emplace(std::pair{ns, key}, round).second);
    }
  }
  ASSERT_EQ(index.size(), reference.size());
  for (const auto& [k, slot] : reference) ASSERT_EQ(index.find(k.first, {k.second, k.second * 31}), slot);
}

}  // namespace
}  // namespace kvpark::daemon
