// The index image (daemon/index_image.h): a kvparkd stopped cleanly leaves its index in
// the kept index memory and the next instance adopts it instead of rebuilding it, every
// entry served byte for byte; it is adopted once (a crash after it rebuilds from the
// records), and an image the state or the memory no longer agrees with is refused in
// one line, the index rebuilt from the records and nothing wrong served.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shm/state_segment.h"
#include "tests/integration/adoption_support.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr const char* memory_name = "kvpark-index-memory";
constexpr const char* index_kept = ", its index kept";
constexpr const char* rebuilding = "the kept index is not used";
constexpr uint64_t header_unit_bytes = 2ull << 20;  // kept_memory_header_bytes

// The adoption line of the latest start.
std::string last_adoption(const DaemonProcess& daemon) {
  const auto lines = log_lines(daemon, "from the previous instance");
  return lines.empty() ? std::string() : lines.back();
}

// 12,241 blocks of 4 KiB: the slab is past 2 MiB, so arrays of both kinds (in place in
// the kept memory, and copied there at the stop) make up the image.
const std::vector<std::string> many_blocks = {"stress", "--block-tokens", "16", "--block-bytes",
                                              "4096",   "--head-tokens",  "16", "--body-tokens",
                                              "4080",   "--iterations",   "48"};
constexpr uint64_t many_blocks_count = 1 + 48 * 255;

TEST(IndexImage, ACleanStopLeavesTheIndexAndTheNextStartAdoptsItEveryByteServed) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  const kvpark_stats before = stats_of(daemon);
  const uint64_t entries = before.blocks + before.snapshots;
  ASSERT_EQ(before.snapshots, 3u);
  // Twice: an adopted index is left again by the next clean stop.
  for (int restart = 1; restart <= 2; ++restart) {
    SCOPED_TRACE("restart " + to_string(restart));
    ASSERT_EQ(daemon.stop(), 0);
    EXPECT_EQ(log_lines(daemon, "left the index of " + to_string(entries) + " entries").size(),
              static_cast<size_t>(restart));
    ASSERT_TRUE(daemon.start());
    const std::string adopted = last_adoption(daemon);
    EXPECT_NE(adopted.find("adopted " + to_string(entries) + " entries"), std::string::npos)
        << adopted;
    EXPECT_NE(adopted.find(index_kept), std::string::npos) << adopted;
    EXPECT_NE(adopted.find("dropped 0"), std::string::npos) << adopted;
    EXPECT_TRUE(log_lines(daemon, rebuilding).empty());
    const kvpark_stats after = stats_of(daemon);
    EXPECT_EQ(after.blocks, before.blocks);
    EXPECT_EQ(after.snapshots, before.snapshots);
    EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes);
    expect_all_restored(daemon, seeds);
  }
  // The adopted index keeps working: new heads park, old and new restore.
  publish(daemon, {711, 712});
  expect_all_restored(daemon, {701, 702, 703, 704, 705, 711, 712});
}

TEST(IndexImage, WithADiskTierEachEntryComesBackOnceWithItsDiskCopy) {
  const DiskDirectory disk("kvpark-index-image");
  DaemonProcess daemon(kept_disk_config(disk));
  ASSERT_TRUE(daemon.start());
  if (!log_lines(daemon, "disk tier off").empty()) GTEST_SKIP() << "no disk tier here";
  publish_written_through(daemon, 760);
  publish(daemon, {761});  // these may spill at the stop
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_EQ(log_lines(daemon, "left the index of 33 entries").size(), 1u);
  ASSERT_TRUE(daemon.start());
  const std::string adopted = last_adoption(daemon);
  EXPECT_NE(adopted.find("adopted 33 entries"), std::string::npos) << adopted;
  EXPECT_NE(adopted.find(index_kept), std::string::npos) << adopted;
  StatsClient after(daemon.socket_path());
  const kvpark_stats s = after.get();
  EXPECT_EQ(s.blocks, 32u);  // on the host and on disk: one entry each
  EXPECT_EQ(s.snapshots, 1u);
  EXPECT_GE(s.disk_entries, 16u);  // the disk tier's scan found each record again
  expect_all_restored(daemon, {760, 761});
}

TEST(IndexImage, AnIndexIsAdoptedOnceAKillAfterItRebuildsFromTheRecords) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());
  ASSERT_NE(last_adoption(daemon).find(index_kept), std::string::npos) << last_adoption(daemon);
  // Changed after the image was adopted, then killed: the image in the kept memory is
  // the first instance's and would miss these, so it must not be adopted again.
  publish(daemon, {721, 722});
  const kvpark_stats before = stats_of(daemon);
  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  const std::string adopted = last_adoption(daemon);
  EXPECT_EQ(adopted.find(index_kept), std::string::npos) << adopted;
  // Not even offered: the instance that adopted it invalidated it as it read it.
  EXPECT_TRUE(log_lines(daemon, rebuilding).empty());
  EXPECT_NE(adopted.find("adopted " + to_string(before.blocks + before.snapshots) + " entries"),
            std::string::npos)
      << adopted;
  EXPECT_EQ(stats_of(daemon).arena_free_bytes, before.arena_free_bytes);
  expect_all_restored(daemon, {701, 702, 703, 704, 705, 721, 722});
}

TEST(IndexImage, RecordsScribbledAfterACleanStopRefuseTheIndexAndDropOnlyWhatFailsItsCheck) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  const kvpark_stats before = stats_of(daemon);
  ASSERT_EQ(daemon.stop(), 0);
  constexpr uint64_t first = 30, count = 10;
  scribble_records(daemon, first, count);

  ASSERT_TRUE(daemon.start());
  const auto refused = log_lines(daemon, rebuilding);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("a state record fails its check"), std::string::npos) << refused[0];
  const std::string adopted = last_adoption(daemon);
  EXPECT_EQ(adopted.find(index_kept), std::string::npos) << adopted;
  EXPECT_NE(adopted.find("dropped " + to_string(count) + " (" + to_string(count) + " damaged)"),
            std::string::npos)
      << adopted;
  const kvpark_stats after = stats_of(daemon);
  EXPECT_EQ(after.blocks + after.snapshots + count, before.blocks + before.snapshots);
  for (int seed_value : seeds) {
    EngineRun run = run_engine(daemon, verify_args(seed_value));
    EXPECT_EQ(run.exit_code, 0) << run.output;  // 3: a wrong byte
  }
  publish(daemon, seeds);
  expect_all_restored(daemon, seeds);
}

TEST(IndexImage, ArraysWrittenOverAfterACleanStopRefuseTheIndexAndTheRebuildServesEverything) {
  DaemonProcess daemon(kept_config(128ull << 20));
  ASSERT_TRUE(daemon.start());
  EngineRun first = run_engine(daemon, many_blocks);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_EQ(stats_of(daemon).blocks, many_blocks_count);
  ASSERT_EQ(daemon.stop(), 0);
  if (!log_lines(daemon, "the kept memory had no room").empty())
    GTEST_SKIP() << "the reserved huge pages ran out under the index (vm.nr_hugepages)";
  ASSERT_EQ(log_lines(daemon, "left the index of").size(), 1u);
  // Past the header unit, the image's arrays: one byte flipped in each 64 KiB of what
  // the memory holds, through a mapping (hugetlbfs, with huge pages reserved, takes no
  // write() and reports no holes).
  const int memory_fd = daemon.fd_store().fd(memory_name);
  ASSERT_GE(memory_fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(memory_fd, &st), 0);
  const size_t span = static_cast<size_t>(st.st_blocks) * 512;
  void* mapped = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_SHARED, memory_fd,
                      static_cast<off_t>(header_unit_bytes));
  ASSERT_NE(mapped, MAP_FAILED);
  uint64_t flipped = 0;
  for (size_t at = 0; at < span; at += 64 << 10, ++flipped)
    static_cast<uint8_t*>(mapped)[at] ^= 0x40;
  munmap(mapped, span);
  ASSERT_GT(flipped, 0u);

  ASSERT_TRUE(daemon.start());
  const auto refused = log_lines(daemon, rebuilding);
  ASSERT_EQ(refused.size(), 1u);
  const std::string adopted = last_adoption(daemon);
  EXPECT_EQ(adopted.find(index_kept), std::string::npos) << adopted;
  EXPECT_NE(adopted.find("adopted " + to_string(many_blocks_count) + " entries"), std::string::npos)
      << adopted;
  EngineRun again = run_engine(daemon, many_blocks);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(published_in(again.output), 0);
}

TEST(IndexImage, AStartThatAdoptsNoArenaDiscardsTheIndexItFound) {
  DaemonProcess daemon(kept_config(64ull << 20));
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  ASSERT_EQ(daemon.stop(), 0);
  // Another arena size: a fresh start, which then dies without a clean stop. The next
  // start adopts the new arena and rebuilds its index: the index of the arena before
  // was discarded (not refused, which would say so).
  daemon.config().arena_bytes = 32ull << 20;
  ASSERT_TRUE(daemon.start());
  EXPECT_TRUE(last_adoption(daemon).empty());
  publish(daemon, {732});
  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  const std::string adopted = last_adoption(daemon);
  EXPECT_EQ(adopted.find(index_kept), std::string::npos) << adopted;
  EXPECT_NE(adopted.find("adopted 16 entries"), std::string::npos) << adopted;
  EXPECT_TRUE(log_lines(daemon, rebuilding).empty());
  expect_all_restored(daemon, {732});
}

}  // namespace
}  // namespace kvpark::testing
