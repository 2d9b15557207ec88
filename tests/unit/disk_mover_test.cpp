// DiskMover over a real disk tier (io_uring on a temporary directory) and an arena in
// anonymous memory: keeping the low-water mark when a chain's parts differ in worth.
#include "daemon/disk_mover.h"

#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "daemon/clock.h"
#include "daemon/counters.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_header.h"
#include "daemon/entry_table.h"
#include "proto/limits.h"
#include "tests/testing/wait.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;
constexpr uint32_t block_tokens = 16;
constexpr uint64_t block_payload_bytes = 1024;
constexpr uint64_t block_extent = shm::extent_bytes_for(block_tokens, block_payload_bytes);
constexpr uint64_t arena_bytes = 8 * block_extent;
constexpr NamespaceId test_ns{0xd15c, 7};

class DiskMoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpark-disk-mover-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    directory_ = dir;
    void* arena =
        mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(arena, MAP_FAILED);
    arena_ = static_cast<uint8_t*>(arena);
    disk::RecoveryReport report;
    disk::OpenError error;
    ASSERT_EQ(DiskTier::open(
                  {.directory = directory_ + "/disk", .fixed_buffers = {{arena_, arena_bytes}}},
                  disk_, report, error),
              Status::Ok)
        << error.detail;
    table_ = std::make_unique<EntryTable>(arena_bytes, granule);
    ASSERT_EQ(
        table_->register_namespace(
            test_ns, {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes}, 0,
            ns_),
        Status::Ok);
    mover_ = std::make_unique<DiskMover>(
        DiskMoverOptions{.arena_data = arena_, .incarnation = 1, .disk = disk_.get()}, *table_,
        counters_);
  }

  // Takes completions until no disk job is in flight; whether that happened in time.
  bool settle() {
    return testing::wait_until([&] {
      (void)mover_->take_completions();
      return mover_->idle();
    });
  }

  void TearDown() override {
    if (mover_ != nullptr) {
      EXPECT_TRUE(settle()) << "spills in flight must finish";
    }
    mover_.reset();
    table_.reset();
    disk_.reset();
    if (arena_ != nullptr) munmap(arena_, arena_bytes);
    std::filesystem::remove_all(directory_);
  }

  // Seals block `index` of a chain (its predecessor's hash `parent`), as of now_usec,
  // with the entry header a reservation writes.
  EntrySlot seal_block(const Hash128& hash, const Hash128& parent, uint32_t index,
                       EntryClass entry_class, uint64_t now_usec) {
    EntrySlot slot = no_slot;
    EXPECT_EQ(table_->insert_reserved({.ns = ns_,
                                       .kind = EntryKind::Block,
                                       .key_hash = hash,
                                       .parent_hash = parent,
                                       .extent_bytes = block_extent,
                                       .position = (index + 1) * block_tokens,
                                       .anchor_chunks = index,
                                       .entry_class = entry_class},
                                      slot),
              Status::Ok);
    const Entry& e = table_->entry(slot);
    const shm::EntryHeader h =
        make_entry_header(e, table_->namespace_info(ns_), block_tokens, block_payload_bytes, 1);
    std::memcpy(arena_ + e.extent_offset, &h, sizeof h);
    table_->seal(slot, 0x5eed + index, now_usec);
    return slot;
  }

  std::string directory_;
  uint8_t* arena_ = nullptr;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<EntryTable> table_;
  NamespaceIndex ns_ = 0;
  Counters counters_;
  std::unique_ptr<DiskMover> mover_;
};

// A chain's second block sealed before its first (two engines, or a single-flight
// follower publishing past a head another engine seals later) puts the first block just
// ahead of the second at the list's cold end. The second is worth a disk write and the
// first is not: demoting the second spills the first too, which takes it off the list,
// and the walk must not then evict it (it used to: an assertion, the daemon gone).
TEST_F(DiskMoverTest, DemotingABlockSpillsItsPredecessorAndNeverEvictsItUnderTheSpill) {
  const Hash128 first{0xf1, 1}, second{0xf2, 1};
  const uint64_t now = coarse_monotonic_usec();
  const EntrySlot second_slot = seal_block(second, first, 1, EntryClass::Shared, now);
  // Private, never hit, sealed long ago by the value model's clock: not worth keeping.
  const EntrySlot first_slot = seal_block(first, test_ns, 0, EntryClass::Private, 0);
  ASSERT_EQ(table_->host_lru_tail(), second_slot);
  ASSERT_EQ(table_->host_lru_prev(second_slot), first_slot);

  mover_->policy().set_low_water_bytes(arena_bytes);  // always below it
  mover_->keep_low_water();

  // Both are being written, predecessor first; neither was evicted.
  EXPECT_TRUE(table_->entry(first_slot).in_use && table_->entry(first_slot).on_host);
  EXPECT_TRUE(table_->entry(second_slot).in_use && table_->entry(second_slot).on_host);
  EXPECT_FALSE(mover_->idle());
  EXPECT_EQ(table_->evictions(), 0u);
  ASSERT_TRUE(settle()) << "the spills did not complete";
  EXPECT_TRUE(table_->entry(first_slot).on_disk);
  EXPECT_TRUE(table_->entry(second_slot).on_disk);
}

// What operators read in kvpark_spill_failures_total{cause}: the errno of a failed
// write named for what to do about it.
TEST(SpillFailureCause, ErrnosAreNamedForWhatToDo) {
  EXPECT_EQ(spill_failure_of_errno(ENOSPC), SpillFailure::no_space);
  EXPECT_EQ(spill_failure_of_errno(EDQUOT), SpillFailure::no_space);
  EXPECT_EQ(spill_failure_of_errno(EROFS), SpillFailure::read_only);
  EXPECT_EQ(spill_failure_of_errno(EIO), SpillFailure::io_error);
  EXPECT_EQ(spill_failure_of_errno(0), SpillFailure::io_error);  // a short write, say
  Counters counters;
  counters.count_spill_failure(SpillFailure::read_only);
  counters.count_spill_failure(SpillFailure::no_space);
  EXPECT_EQ(counters.spill_failures, 2u);
  EXPECT_EQ(counters.spill_failures_by_cause[size_t(SpillFailure::read_only)], 1u);
  EXPECT_STREQ(spill_failure_name(SpillFailure::damaged_header), "damaged_header");
}

}  // namespace
}  // namespace kvpark::daemon
