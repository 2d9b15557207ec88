// The entry table's huge-page memory: large arrays are 2 MiB-aligned mappings advised
// for huge pages, small ones plain heap; the node pool reuses what is freed, never
// hands out overlapping objects, and backs a hash map through heavy churn.
#include "daemon/huge_page_allocator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>

namespace kvpark::daemon {
namespace {

bool thp_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(in, modes);
  return !modes.empty() && modes.find("[never]") == std::string::npos;
}

// The "THPeligible:" value of the mapping holding p, from /proc/self/smaps; -1 if none.
int thp_eligible(const void* p) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find('-')) {
      inside = at >= begin && at < end;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

TEST(HugePageAllocator, AnArrayOfTwoMebibytesIsAlignedAndAdvisedForHugePages) {
  HugePageAllocator<uint64_t> alloc;
  const size_t n = huge_allocation_bytes_min / sizeof(uint64_t);
  uint64_t* p = alloc.allocate(n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % huge_page_bytes, 0u);
  for (size_t i = 0; i < n; ++i) p[i] = i;  // all of it is ours
  EXPECT_EQ(p[n - 1], n - 1);
  if (thp_available()) {
    EXPECT_EQ(thp_eligible(p), 1);
  }
  alloc.deallocate(p, n);
}

TEST(HugePageAllocator, AnArrayJustBelowTwoMebibytesIsPlainHeap) {
  HugePageAllocator<uint8_t> alloc;
  uint8_t* p = alloc.allocate(huge_allocation_bytes_min - 1);
  std::memset(p, 1, huge_allocation_bytes_min - 1);
  alloc.deallocate(p, huge_allocation_bytes_min - 1);
}

TEST(HugePageAllocator, AVectorGrowsAcrossTheThresholdAndKeepsItsContents) {
  HugePageVector<uint32_t> v;
  for (uint32_t i = 0; i < 3 * huge_page_bytes / sizeof(uint32_t); ++i) v.push_back(i);
  for (uint32_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % huge_page_bytes, 0u);
}

TEST(NodePool, AFreedObjectIsTheNextOneHandedOutOfItsSize) {
  NodePool pool;
  void* a = pool.allocate(48);
  void* b = pool.allocate(48);
  EXPECT_NE(a, b);
  pool.deallocate(a, 48);
  void* other_size = pool.allocate(64);
  EXPECT_NE(other_size, a);  // another size class does not take it
  EXPECT_EQ(pool.allocate(48), a);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % pool_granule_bytes, 0u);
}

TEST(NodePool, ObjectsNeverOverlapAcrossChunks) {
  NodePool pool;
  const size_t count = 2 * huge_page_bytes / pool_object_bytes_max + 7;  // three chunks
  std::set<uintptr_t> starts;
  for (size_t i = 0; i < count; ++i) {
    auto* p = static_cast<uint8_t*>(pool.allocate(pool_object_bytes_max));
    std::memset(p, static_cast<int>(i), pool_object_bytes_max);
    starts.insert(reinterpret_cast<uintptr_t>(p));
  }
  ASSERT_EQ(starts.size(), count);
  for (auto it = starts.begin(); std::next(it) != starts.end(); ++it) {
    EXPECT_GE(*std::next(it) - *it, pool_object_bytes_max);
  }
  EXPECT_EQ(pool.chunk_bytes(), 3 * huge_page_bytes);
}

TEST(NodePool, BacksAHashMapThroughChurnAsAPlainMapWould) {
  NodePool pool;
  using Alloc = HugePageAllocator<std::pair<const uint64_t, uint32_t>>;
  std::unordered_map<uint64_t, uint32_t, std::hash<uint64_t>, std::equal_to<uint64_t>, Alloc> map(
      0, std::hash<uint64_t>{}, std::equal_to<uint64_t>{}, Alloc(&pool));
  std::map<uint64_t, uint32_t> reference;
  std::mt19937_64 rng(20261202);
  for (int round = 0; round < 200'000; ++round) {
    const uint64_t key = rng() % 50'000;
    if (rng() % 3 == 0) {
      EXPECT_EQ(map.erase(key), reference.erase(key));
    } else {
      map[key] = static_cast<uint32_t>(round);
      reference[key] = static_cast<uint32_t>(round);
    }
  }
  ASSERT_EQ(map.size(), reference.size());
  for (const auto& [k, v] : reference) ASSERT_EQ(map.at(k), v);
  // 50k live nodes of at most 48 bytes, reused through the free list: a few chunks.
  EXPECT_LE(pool.chunk_bytes(), 2 * huge_page_bytes);
}

}  // namespace
}  // namespace kvpark::daemon
