// A restarted kvparkd adopts the arena the service manager kept for it (the fd
// store, played here by the harness: tests/testing/fd_store.h): every sealed entry is
// served again, byte for byte, after SIGTERM and after SIGKILL; a changed arena size
// starts fresh, has the stale fds removed and says why in one line; a state segment
// written over drops what fails its checks and serves nothing wrong; the index memory
// is kept too, reused at the next start, and trusted for nothing; with kept_memory_dir
// on a tmpfs, the state segment and index memory are files of it and adopted the same.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "shm/state_segment.h"
#include "tests/integration/adoption_support.h"
#include "tests/testing/huge_tmpfs.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

using std::to_string;

TEST(Adoption, SigtermRestartServesEverySealedEntryByteForByte) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  const kvpark_stats before = stats_of(daemon);
  ASSERT_EQ(before.blocks, seeds.size() * 16);
  ASSERT_EQ(before.snapshots, 3u);
  for (const std::string& name : stored_names) EXPECT_EQ(daemon.fd_store().count(name), 1u) << name;

  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());
  const kvpark_stats after = stats_of(daemon);
  EXPECT_EQ(after.blocks, before.blocks);
  EXPECT_EQ(after.snapshots, before.snapshots);
  EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes);  // recomputed from the records
  expect_all_restored(daemon, seeds);
  expect_one_whole_adoption(daemon, before.blocks + before.snapshots);
  // Adopted, not re-stored: the manager still holds one of each.
  for (const std::string& name : stored_names) EXPECT_EQ(daemon.fd_store().count(name), 1u) << name;
}

TEST(Adoption, SigkillRestartServesEveryEntrySealedBeforeTheKill) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  // A writer killed with the daemon, mid-write: its reservation is held at adoption and
  // freed once the new instance sees the writer gone.
  ChildProcess writer = spawn_engine(daemon, {"hang-while-writing", "--head-seed", "798"});
  ASSERT_TRUE(writer.wait_for_line("ready", 10'000));
  const kvpark_stats before = stats_of(daemon);
  ASSERT_EQ(before.reservations, 1u);
  daemon.kill_hard();
  writer.kill_hard();
  ASSERT_TRUE(daemon.start());
  EXPECT_EQ(log_lines(daemon, "holding 16 extents").size(), 1u);
  // This process may count among the previous instance's engines too (its stats
  // connection's close can come after the kill): its next HELLO ends its share.
  (void)stats_of(daemon);
  ASSERT_TRUE(wait_until([&] { return !log_lines(daemon, "may be evicted from now on").empty(); }));
  const kvpark_stats after = stats_of(daemon);
  EXPECT_EQ(after.blocks, before.blocks);
  EXPECT_EQ(after.snapshots, before.snapshots);
  EXPECT_EQ(after.reservations, 0u);
  EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes + 16 * (68ull << 10));
  expect_all_restored(daemon, seeds);
  // The blocks in flight at the kill were never sealed: another engine writes them all.
  EngineRun again = run_engine(daemon, {"publish", "--head-seed", "798"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(published_in(again.output), 16);
  expect_all_restored(daemon, {798});
}

TEST(Adoption, ChangedArenaSizeStartsFreshRemovesTheStaleFdsAndSaysWhyOnce) {
  DaemonProcess daemon(kept_config(64ull << 20));
  ASSERT_TRUE(daemon.start());
  publish(daemon, {711});
  ASSERT_EQ(daemon.stop(), 0);
  const uint64_t removed_before = daemon.fd_store().removed();
  daemon.config().arena_bytes = 32ull << 20;
  ASSERT_TRUE(daemon.start());
  const auto fresh = log_lines(daemon, "starting with an empty arena");
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_NE(fresh[0].find("the kept arena is 64 MiB, the configuration asks for 32 MiB"),
            std::string::npos)
      << fresh[0];
  EXPECT_TRUE(log_lines(daemon, "from the previous instance").empty());
  EXPECT_EQ(daemon.fd_store().removed() - removed_before, 3u);
  for (const std::string& name : stored_names) EXPECT_EQ(daemon.fd_store().count(name), 1u) << name;
  const kvpark_stats s = stats_of(daemon);
  EXPECT_EQ(s.blocks, 0u);
  EXPECT_EQ(s.arena_data_bytes, 32ull << 20);
  // The new arena is kept in turn.
  publish(daemon, {712});
  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  expect_all_restored(daemon, {712});
}

TEST(Adoption, AnAdoptedEntryKeepsItsDiskCopyAndIsIndexedOnce) {
  const DiskDirectory disk("kvpark-adoption");
  DaemonProcess daemon(kept_disk_config(disk));
  ASSERT_TRUE(daemon.start());
  if (!log_lines(daemon, "disk tier off").empty()) GTEST_SKIP() << "no disk tier here";
  publish_written_through(daemon, 760);
  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  const kvpark_stats after = stats_of(daemon);
  EXPECT_EQ(after.blocks, 16u);        // on the host and on disk: one entry each
  EXPECT_EQ(after.disk_entries, 16u);  // the disk tier's scan found each adopted entry's record
  expect_all_restored(daemon, {760});
}

TEST(Adoption, WithoutAServiceManagerKeepingFdsARestartStartsEmptyAsBefore) {
  DaemonProcess daemon({.arena_bytes = 64ull << 20, .fd_store = false});
  ASSERT_TRUE(daemon.start());
  publish(daemon, {721});
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());
  EXPECT_EQ(stats_of(daemon).blocks, 0u);
  EXPECT_TRUE(log_lines(daemon, "starting with an empty arena").empty());
}

TEST(Adoption, ScribbledStateDropsWhatFailsItsCheckAndServesNothingWrong) {
  DaemonProcess daemon(kept_config());
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  const kvpark_stats before = stats_of(daemon);
  daemon.kill_hard();
  constexpr uint64_t first = 20, count = 20;
  scribble_records(daemon, first, count);

  ASSERT_TRUE(daemon.start());
  const auto adopted = log_lines(daemon, "from the previous instance");
  ASSERT_EQ(adopted.size(), 1u);
  EXPECT_NE(adopted[0].find("dropped " + to_string(count) + " (" + to_string(count) + " damaged)"),
            std::string::npos)
      << adopted[0];
  const kvpark_stats after = stats_of(daemon);
  EXPECT_EQ(after.blocks + after.snapshots + count, before.blocks + before.snapshots);
  // Restores stop where a dropped entry was; nothing restored is wrong (exit code 3).
  for (int seed_value : seeds) {
    EngineRun run = run_engine(daemon, verify_args(seed_value));
    EXPECT_EQ(run.exit_code, 0) << run.output;
  }
  // Republishing repairs what was dropped.
  publish(daemon, seeds);
  expect_all_restored(daemon, seeds);
}

TEST(Adoption, TheIndexMemoryIsKeptReusedAndTrustedForNothing) {
  // 12,241 blocks of 4 KiB (one head block, 48 bodies of 255): the entry table's slab
  // is past 2 MiB, so it lives in the kept index memory (daemon/kept_memory.h).
  DaemonProcess daemon(kept_config(128ull << 20));
  ASSERT_TRUE(daemon.start());
  // Each iteration publishes its prompt (nothing when every block is parked), then
  // restores it and checks every byte.
  const std::vector<std::string> bodies = {"stress", "--block-tokens", "16", "--block-bytes",
                                           "4096",   "--head-tokens",  "16", "--body-tokens",
                                           "4080",   "--iterations",   "48"};
  constexpr uint64_t blocks = 1 + 48 * 255;
  EngineRun first = run_engine(daemon, bodies);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const kvpark_stats before = stats_of(daemon);
  ASSERT_EQ(before.blocks, blocks);
  constexpr const char* memory_name = "kvpark-index-memory";
  ASSERT_EQ(daemon.fd_store().count(memory_name), 1u);

  ASSERT_EQ(daemon.stop(), 0);
  // What the stopped daemon left: its arrays' pages. Written over with garbage here.
  const int memory_fd = daemon.fd_store().fd(memory_name);
  struct stat st {};
  ASSERT_EQ(fstat(memory_fd, &st), 0);
  const uint64_t left_bytes = static_cast<uint64_t>(st.st_blocks) * 512;
  EXPECT_GE(left_bytes, 2ull << 20);
  // Through a mapping: hugetlbfs (huge pages reserved) takes no write().
  const size_t garbage_bytes = left_bytes + (8ull << 20);
  void* garbage = mmap(nullptr, garbage_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memory_fd, 0);
  ASSERT_NE(garbage, MAP_FAILED);
  std::memset(garbage, 0xa5, garbage_bytes);
  munmap(garbage, garbage_bytes);

  ASSERT_TRUE(daemon.start());
  const auto reused = log_lines(daemon, "of index memory kept by the previous instance");
  ASSERT_EQ(reused.size(), 1u);
  EXPECT_EQ(reused[0].find("reusing 0 MiB"), std::string::npos) << reused[0];
  const auto adopted = log_lines(daemon, "from the previous instance");
  ASSERT_EQ(adopted.size(), 1u);
  EXPECT_NE(adopted[0].find("adopted " + to_string(blocks) + " entries"), std::string::npos)
      << adopted[0];
  EXPECT_NE(adopted[0].find("dropped 0"), std::string::npos) << adopted[0];
  // The garbage written past the arrays' pages is given back once the index is built.
  EXPECT_EQ(log_lines(daemon, "of kept index memory the index did not need").size(), 1u);
  EXPECT_EQ(daemon.fd_store().count(memory_name), 1u);  // reused, not stored again
  EXPECT_EQ(stats_of(daemon).arena_free_bytes, before.arena_free_bytes);
  // Every block is found (nothing published again) and restores byte for byte.
  EngineRun again = run_engine(daemon, bodies);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(published_in(again.output), 0);
  const auto restores = restores_in(again.output);
  ASSERT_EQ(restores.size(), 48u);
  for (const auto& r : restores) EXPECT_EQ(r.tokens, full_restore_tokens(16 + 4080, 16));
  EXPECT_EQ(stats_of(daemon).blocks, blocks);
}

// What the shipped unit does: kept_memory_dir on a tmpfs of the service's own, mounted
// with huge=within_size. The state segment and the index memory the manager keeps are
// files of that tmpfs (2 MiB pages whatever shmem_enabled says, and the log says so
// when the kernel gave them), and a SIGKILL restart adopts them as it adopts memfds.
TEST(Adoption, AKeptMemoryDirectoryHoldsTheStateAndIndexMemoryThroughAKill) {
  HugeTmpfs tmpfs;
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  DaemonConfig config = kept_config();
  config.extra_args = {"--kept-memory-dir", tmpfs.path()};
  DaemonProcess daemon(config);
  ASSERT_TRUE(daemon.start());
  publish(daemon, seeds);
  const kvpark_stats before = stats_of(daemon);
  for (const char* name : {state_fd_name, "kvpark-index-memory"})
    EXPECT_TRUE(tmpfs.holds_unnamed(daemon.fd_store().fd(name))) << name;
  // The segment's header page was written at start: its size is the page the kernel gave.
  struct stat state {};
  ASSERT_EQ(fstat(daemon.fd_store().fd(state_fd_name), &state), 0);
  const bool huge_page = static_cast<uint64_t>(state.st_blocks) * 512 >= (2ull << 20);
  EXPECT_EQ(log_lines(daemon, "state segment on transparent huge pages").size(),
            huge_page ? 1u : 0u);

  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  expect_one_whole_adoption(daemon, before.blocks + before.snapshots);
  EXPECT_EQ(log_lines(daemon, "of index memory kept by the previous instance").size(), 1u);
  expect_all_restored(daemon, seeds);
}

// A kept_memory_dir that is no tmpfs (a disk's directory would put the state on disk)
// is refused in one line, and memfds serve as without one.
TEST(Adoption, AKeptMemoryDirectoryOnAnotherFileSystemIsRefusedInOneLine) {
  struct statfs fs {};
  ASSERT_EQ(statfs("/var/tmp", &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << "/var/tmp is a tmpfs here";
  DaemonConfig config = kept_config();
  config.extra_args = {"--kept-memory-dir", "/var/tmp"};
  DaemonProcess daemon(config);
  ASSERT_TRUE(daemon.start());
  const auto refused = log_lines(daemon, "kept_memory_dir /var/tmp cannot hold");
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_NE(refused[0].find("(not a tmpfs): memfds instead"), std::string::npos) << refused[0];
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + to_string(daemon.fd_store().fd(state_fd_name));
  ASSERT_GT(readlink(link.c_str(), target, sizeof target - 1), 0);
  EXPECT_EQ(std::string(target).rfind("/memfd:", 0), 0u) << target;
  publish(daemon, {seeds[0]});
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());
  expect_all_restored(daemon, {seeds[0]});
}

}  // namespace
}  // namespace kvpark::testing
