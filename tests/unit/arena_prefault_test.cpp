// A client mapping's prefault fills exactly the 2 MiB regions a copy touches that
// it has not filled before (one MADV_POPULATE_WRITE per run of them), nothing past
// the arena's end, and nothing for copies too small to be worth it. The mapping's
// resident size (/proc/self/smaps) shows which page tables were filled.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <optional>

#include "proto/limits.h"
#include "shm/arena.h"
#include "tests/testing/smaps.h"

namespace kvpark::shm {
namespace {

constexpr uint64_t mib = 1024 * 1024;
constexpr uint64_t region = 2 * mib;

// Resident KiB of the mapping that starts at `p`.
uint64_t resident_kib(const void* p) {
  const std::optional<uint64_t> kib = testing::smaps_field(p, "Rss:");
  EXPECT_TRUE(kib.has_value()) << "no mapping at " << p;
  return kib.value_or(0);
}

class ArenaPrefault : public ::testing::Test {
 protected:
  void SetUp() override {
    int err = 0;
    // 4 KiB pages: the resident size then counts exactly the pages mapped here.
    ASSERT_EQ(ArenaOwner::create({.name = "kvpark-prefault-test", .data_bytes = 21 * mib,
                                  .incarnation = 7, .huge_pages = HugePages::Off},
                                 owner_, err),
              Status::Ok)
        << err;
    ASSERT_EQ(ArenaMapping::attach(dup(owner_->header_fd()), dup(owner_->data_fd()),
                                   owner_->data_bytes(), 7, mapping_),
              Status::Ok);
  }
  uint64_t resident_mib() const { return resident_kib(mapping_->data()) / 1024; }
  uint8_t* at(uint64_t offset) const { return mapping_->data() + offset; }

  std::unique_ptr<ArenaOwner> owner_;
  std::shared_ptr<ArenaMapping> mapping_;
};

TEST_F(ArenaPrefault, AFreshMappingHasNoPagesMapped) { EXPECT_EQ(resident_mib(), 0u); }

TEST_F(ArenaPrefault, FillsTheRegionsACopyTouches) {
  mapping_->prefault(at(region + mib / 2), mib);  // inside region 1 only
  EXPECT_EQ(resident_mib(), 2u);
}

TEST_F(ArenaPrefault, FillsTheRunsAroundARegionAlreadyFilled) {
  mapping_->prefault(at(region), region);  // region 1
  mapping_->prefault(at(0), 5 * region);   // regions 0 and 2..4: two runs
  EXPECT_EQ(resident_mib(), 10u);
}

TEST_F(ArenaPrefault, StopsAtTheArenaEnd) {
  // 21 MiB (the smallest arena is 16): regions 0..9 whole, region 10 the last 1 MiB.
  mapping_->prefault(at(19 * mib), 2 * mib);
  EXPECT_EQ(resident_mib(), 3u);  // region 9 (2 MiB) and the 1 MiB tail
}

TEST_F(ArenaPrefault, LeavesSmallCopiesAndRangesOutsideTheArenaToFaults) {
  mapping_->prefault(at(0), limits::prefault_min_bytes - 1);
  mapping_->prefault(at(20 * mib), 2 * mib);  // runs past the end
  EXPECT_EQ(resident_mib(), 0u);
}

}  // namespace
}  // namespace kvpark::shm
