// The entry table's huge-page memory: large arrays are 2 MiB-aligned mappings advised
// for huge pages, small ones plain heap, and a vector keeps its contents as it grows
// from one to the other.
#include "daemon/huge_page_allocator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>

#include "tests/testing/smaps.h"

namespace kvpark::daemon {
namespace {

bool thp_available() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(in, modes);
  return !modes.empty() && modes.find("[never]") == std::string::npos;
}

TEST(HugePageAllocator, AnArrayOfTwoMebibytesIsAlignedAndAdvisedForHugePages) {
  HugePageAllocator<uint64_t> alloc;
  const size_t n = huge_allocation_bytes_min / sizeof(uint64_t);
  uint64_t* p = alloc.allocate(n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % huge_page_bytes, 0u);
  for (size_t i = 0; i < n; ++i) p[i] = i;  // all of it is ours
  EXPECT_EQ(p[n - 1], n - 1);
  if (thp_available()) {
    EXPECT_EQ(testing::smaps_field(p, "THPeligible:"), 1u);
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

}  // namespace
}  // namespace kvpark::daemon
