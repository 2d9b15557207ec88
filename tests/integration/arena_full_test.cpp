// A full arena: what is leased is never taken, a publish that cannot fit fails
// with a clear status and costs no parked state, and unleased entries make room
// in LRU order.
//
// Geometry throughout: 64-token blocks of 64 KiB (the engine's default) in a
// 16 MiB arena, about 240 extents; a 6400-token prompt is 100 blocks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint64_t arena_bytes = 16ull << 20;
constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 64 * 1024;
constexpr size_t prompt_tokens = 6400;  // 100 blocks
const uint32_t full = full_restore_tokens(prompt_tokens, block_tokens);

std::vector<std::string> big_prompt(const char* mode, int head_seed) {
  return {mode, "--head-seed", to_string(head_seed), "--head-tokens", to_string(prompt_tokens)};
}

uint32_t restored_by_verify(const DaemonProcess& daemon, int head_seed) {
  EngineRun v = run_engine(daemon, big_prompt("verify", head_seed));
  EXPECT_EQ(v.exit_code, 0) << v.output;  // every restored byte is intact
  const auto r = restores_in(v.output);
  EXPECT_EQ(r.size(), 1u);
  return r.empty() ? UINT32_MAX : r[0].tokens;
}

void publish(const DaemonProcess& daemon, int head_seed) {
  EngineRun p = run_engine(daemon, big_prompt("publish", head_seed));
  ASSERT_EQ(p.exit_code, 0) << p.output;
  ASSERT_EQ(published_in(p.output), 100);
}

TEST(ArenaFull, PublishFailsWhileEverythingIsLeasedAndParkedEntriesStayReadable) {
  DaemonProcess daemon({.arena_bytes = arena_bytes});
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  publish(daemon, 61);
  publish(daemon, 62);
  std::vector<ChildProcess> holders;
  for (int seed : {61, 62}) {
    holders.push_back(spawn_engine(daemon, big_prompt("hold-lease", seed)));
    ASSERT_TRUE(holders.back().wait_for_line("ready", 10'000));
  }
  const kvpark_stats before = stats.get();
  ASSERT_EQ(before.leases, 2u);
  ASSERT_EQ(before.blocks, 200u);

  // 100 more blocks fit neither in free space nor by evicting the unleased rest.
  ClientPtr client = connect_client(daemon.socket_path(),
                                    engine_namespace(1, block_tokens, block_bytes));
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> tokens = engine_prompt(63, prompt_tokens);
  EXPECT_EQ(park_blocks(client.get(), 1, block_bytes, tokens, 0), KVPARK_ARENA_FULL);
  // An engine process sees the same failure (exit 4: a libkvpark call failed).
  EXPECT_EQ(run_engine(daemon, big_prompt("publish", 63)).exit_code, 4);

  const kvpark_stats after = stats.get();
  EXPECT_EQ(after.blocks, 200u);
  EXPECT_EQ(after.evictions, 0u);  // a failed publish costs no parked state
  EXPECT_EQ(after.reservations, 0u);
  EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes);
  EXPECT_EQ(restored_by_verify(daemon, 61), full);
  EXPECT_EQ(restored_by_verify(daemon, 62), full);

  // Once the readers are gone the same publish evicts and succeeds.
  for (ChildProcess& h : holders) h.kill_hard();
  ASSERT_TRUE(stats.wait_until([](const kvpark_stats& s) { return s.leases == 0; }, 5'000));
  EXPECT_EQ(park_blocks(client.get(), 1, block_bytes, tokens, 0), KVPARK_OK);
  EXPECT_GT(stats.get().evictions, 0u);
  EXPECT_EQ(restored_by_verify(daemon, 63), full);
}

class OversizedReservation : public ::testing::TestWithParam<uint64_t> {};

// The reservation cap (default: half the arena) answers LIMIT_EXCEEDED; with the
// cap above the arena, the arena answers ARENA_FULL. Either way nothing is evicted.
TEST_P(OversizedReservation, FailsWithoutEvictingAnything) {
  const uint64_t reservation_max = GetParam();
  DaemonProcess daemon({.arena_bytes = arena_bytes, .reservation_bytes_max = reservation_max});
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  publish(daemon, 64);
  const kvpark_stats before = stats.get();
  ASSERT_EQ(before.leases, 0u);  // everything parked is evictable

  ClientPtr client = connect_client(daemon.socket_path(),
                                    engine_namespace(1, block_tokens, block_bytes));
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> tokens = engine_prompt(65, 3 * prompt_tokens);  // 300 blocks
  const kvpark_status s = park_blocks(client.get(), 1, block_bytes, tokens, 0);
  EXPECT_EQ(s, reservation_max == 0 ? KVPARK_LIMIT_EXCEEDED : KVPARK_ARENA_FULL)
      << kvpark_status_string(s);

  const kvpark_stats after = stats.get();
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.blocks, before.blocks);
  EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes);
  EXPECT_EQ(after.reservations, 0u);
  EXPECT_EQ(restored_by_verify(daemon, 64), full);
}

INSTANTIATE_TEST_SUITE_P(Caps, OversizedReservation, ::testing::Values(0, 1ull << 30),
                         [](const auto& param_info) {
                           return std::string(param_info.param == 0 ? "DefaultCap" : "CapAboveArena");
                         });

TEST(ArenaFull, UnleasedEntriesAreEvictedLeastRecentlyUsedFirst) {
  DaemonProcess daemon({.arena_bytes = arena_bytes});
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  publish(daemon, 66);
  publish(daemon, 67);
  EXPECT_EQ(restored_by_verify(daemon, 66), full);  // 66 is now more recent than 67
  ASSERT_EQ(stats.get().evictions, 0u);

  publish(daemon, 68);  // needs room: evicts from 67, the least recently used
  const kvpark_stats s = stats.get();
  EXPECT_GT(s.evictions, 0u);
  EXPECT_EQ(s.leases, 0u);
  EXPECT_EQ(restored_by_verify(daemon, 68), full);
  EXPECT_EQ(restored_by_verify(daemon, 66), full);
  const uint32_t evicted_prompt = restored_by_verify(daemon, 67);
  EXPECT_LT(evicted_prompt, full);
}

}  // namespace
}  // namespace kvpark::testing
