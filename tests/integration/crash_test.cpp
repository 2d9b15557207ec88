// Engines SIGKILLed in the middle of an operation: the daemon's one cleanup
// routine must abort their reservations and drop their leases, so the arena's
// free bytes return to their baseline and the daemon keeps serving everyone else.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shm/arena_format.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 16 * 1024;
constexpr int cleanup_timeout_msec = 5'000;

std::vector<std::string> small_blocks(std::vector<std::string> args) {
  args.insert(args.end(), {"--block-tokens", to_string(block_tokens), "--block-bytes",
                           to_string(block_bytes)});
  return args;
}

void expect_restores_fully(const DaemonProcess& daemon, const std::string& head_seed) {
  EngineRun v = run_engine(daemon, small_blocks({"verify", "--head-seed", head_seed}));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full_restore_tokens(1024, block_tokens));
}

bool back_to(const kvpark_stats& s, const kvpark_stats& baseline) {
  return s.reservations == baseline.reservations && s.leases == baseline.leases &&
         s.arena_free_bytes == baseline.arena_free_bytes && s.blocks == baseline.blocks;
}

class KilledWriter : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledWriter, DaemonAbortsItsReservationAndKeepsServing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  // State parked before the crash must survive it.
  EngineRun earlier = run_engine(daemon, small_blocks({"publish", "--head-seed", "51"}));
  ASSERT_EQ(earlier.exit_code, 0) << earlier.output;
  const kvpark_stats baseline = stats.get();
  ASSERT_EQ(baseline.reservations, 0u);

  ChildProcess writer = spawn_engine(daemon, small_blocks({GetParam(), "--head-seed", "52"}));
  ASSERT_TRUE(writer.wait_for_line("ready", 10'000));
  const kvpark_stats during = stats.get();
  ASSERT_EQ(during.reservations, baseline.reservations + 1);
  ASSERT_EQ(baseline.arena_free_bytes - during.arena_free_bytes,
            16 * shm::extent_bytes_for(block_tokens, block_bytes));

  // The hung writer stalls nobody.
  expect_restores_fully(daemon, "51");

  writer.kill_hard();
  kvpark_stats last{};
  EXPECT_TRUE(stats.wait_until([&](const kvpark_stats& s) { return back_to(s, baseline); },
                               cleanup_timeout_msec, &last))
      << "reservations " << last.reservations << " free " << last.arena_free_bytes << " (baseline "
      << baseline.arena_free_bytes << ")";

  // The aborted blocks left the index: another engine writes every one of them.
  EngineRun again = run_engine(daemon, small_blocks({"publish", "--head-seed", "52"}));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(published_in(again.output), 16);
  expect_restores_fully(daemon, "52");
  expect_restores_fully(daemon, "51");
  EngineRun other = run_engine(daemon, small_blocks({"stress", "--head-seed", "53", "--iterations", "2",
                                                     "--body-tokens", "128"}));
  EXPECT_EQ(other.exit_code, 0) << other.output;
}

INSTANTIATE_TEST_SUITE_P(AtEveryStage, KilledWriter,
                         ::testing::Values("hang-in-reserve", "hang-while-writing",
                                           "hang-before-seal"),
                         [](const auto& param_info) {
                           std::string name = param_info.param;
                           std::erase(name, '-');
                           return name;
                         });

TEST(KilledReader, DaemonDropsItsLeasesAndKeepsServing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  EngineRun publisher = run_engine(daemon, small_blocks({"publish", "--head-seed", "54"}));
  ASSERT_EQ(publisher.exit_code, 0) << publisher.output;
  const kvpark_stats baseline = stats.get();
  ASSERT_EQ(baseline.leases, 0u);

  std::vector<ChildProcess> readers;
  for (int i = 0; i < 2; ++i) {
    readers.push_back(spawn_engine(daemon, small_blocks({"hold-lease", "--head-seed", "54"})));
    ASSERT_TRUE(readers.back().wait_for_line("ready", 10'000));
  }
  ASSERT_EQ(stats.get().leases, 2u);
  expect_restores_fully(daemon, "54");  // readers do not block readers

  for (ChildProcess& reader : readers) reader.kill_hard();
  kvpark_stats last{};
  EXPECT_TRUE(stats.wait_until([&](const kvpark_stats& s) { return back_to(s, baseline); },
                               cleanup_timeout_msec, &last))
      << "leases " << last.leases;
  expect_restores_fully(daemon, "54");
  EngineRun other = run_engine(daemon, small_blocks({"stress", "--head-seed", "55", "--iterations", "2"}));
  EXPECT_EQ(other.exit_code, 0) << other.output;
}

// 64 KiB blocks in a 16 MiB arena: about 240 extents.
TEST(KilledReader, EntriesItLeasedBecomeEvictableAgain) {
  DaemonProcess daemon({.arena_bytes = 16ull << 20, .reservation_bytes_max = 16ull << 20});
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  EngineRun leased = run_engine(daemon, {"publish", "--head-seed", "56"});  // 16 blocks
  ASSERT_EQ(leased.exit_code, 0) << leased.output;

  ChildProcess reader = spawn_engine(daemon, {"hold-lease", "--head-seed", "56"});
  ASSERT_TRUE(reader.wait_for_line("ready", 10'000));
  ASSERT_EQ(stats.get().leases, 1u);
  reader.kill_hard();
  ASSERT_TRUE(stats.wait_until([](const kvpark_stats& s) { return s.leases == 0; },
                               cleanup_timeout_msec));

  // One 230-block prompt fits only if some of the killed reader's entries go: had
  // its lease survived, the publish would fail with ARENA_FULL.
  EngineRun filler = run_engine(daemon, {"publish", "--head-seed", "570", "--head-tokens",
                                         to_string(230 * 64)});
  ASSERT_EQ(filler.exit_code, 0) << filler.output;
  EXPECT_GE(stats.get().evictions, 1u);
  EngineRun v = run_engine(daemon, {"verify", "--head-seed", "56"});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_LT(r[0].tokens, full_restore_tokens(1024, 64));
}

}  // namespace
}  // namespace kvpark::testing
