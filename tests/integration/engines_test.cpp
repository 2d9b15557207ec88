// Several real engine processes against one real kvparkd: concurrent publish and
// restore, restore after the publisher exited, namespace isolation, deduplication.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 16 * 1024;

std::vector<std::string> small_blocks(std::vector<std::string> args) {
  args.insert(args.end(), {"--block-tokens", to_string(block_tokens), "--block-bytes",
                           to_string(block_bytes)});
  return args;
}

TEST(ConcurrentEngines, FourProcessesRestoreExactlyWhatWasPublished) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  constexpr int engines = 4;
  constexpr int iterations = 8;
  constexpr size_t head_tokens = 1024, body_tokens = 256;
  std::vector<EngineRun> runs(engines);
  std::vector<std::thread> threads;
  for (int i = 0; i < engines; ++i) {
    threads.emplace_back([&, i] {
      runs[i] = run_engine(daemon, small_blocks({"stress", "--head-seed", "11", "--head-tokens",
                                                 to_string(head_tokens), "--body-seed",
                                                 to_string(100 + i), "--body-tokens",
                                                 to_string(body_tokens), "--iterations",
                                                 to_string(iterations), "--session",
                                                 to_string(i + 1)}),
                           30'000);
    });
  }
  for (std::thread& t : threads) t.join();
  uint64_t restored_total = 0;
  const uint32_t full = full_restore_tokens(head_tokens + body_tokens, block_tokens);
  for (int i = 0; i < engines; ++i) {
    SCOPED_TRACE("engine " + to_string(i));
    EXPECT_EQ(runs[i].exit_code, 0) << runs[i].output;  // 3: a restored byte differed
    const auto restores = restores_in(runs[i].output);
    EXPECT_EQ(restores.size(), size_t{iterations});
    for (const Restore& r : restores) {
      EXPECT_LE(r.tokens, full);
      EXPECT_EQ(r.tokens % block_tokens, 0u);
      restored_total += r.tokens;
    }
  }
  EXPECT_GT(restored_total, 0u);

  // The shared head is stored once; every body block of every iteration is there.
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats s = stats.get();
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.blocks, head_tokens / block_tokens + engines * iterations * body_tokens / block_tokens);
  EXPECT_EQ(s.leases, 0u);
  EXPECT_EQ(s.reservations, 0u);

  // A fresh process restores each engine's last prompt completely and bit-exact.
  for (int i = 0; i < engines; ++i) {
    const uint64_t last_body_seed = uint64_t(100 + i) * 1000003 + (iterations - 1);
    EngineRun v = run_engine(daemon, small_blocks({"verify", "--head-seed", "11", "--head-tokens",
                                                   to_string(head_tokens), "--body-seed",
                                                   to_string(last_body_seed), "--body-tokens",
                                                   to_string(body_tokens)}));
    EXPECT_EQ(v.exit_code, 0) << v.output;
    const auto restores = restores_in(v.output);
    ASSERT_EQ(restores.size(), 1u);
    EXPECT_EQ(restores[0].tokens, full);
  }
}

TEST(EngineRestart, NewProcessRestoresWhatAnExitedEngineParked) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  const std::vector<std::string> prompt = {"--head-seed", "21", "--head-tokens", "1024",
                                           "--body-seed", "22", "--body-tokens", "300"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), prompt.begin(), prompt.end());
    return small_blocks(args);
  };
  EngineRun publisher = run_engine(daemon, with({"publish", "--session", "7"}));
  ASSERT_EQ(publisher.exit_code, 0) << publisher.output;
  EXPECT_EQ(published_in(publisher.output), 1324 / block_tokens);

  const uint32_t full = full_restore_tokens(1324, block_tokens);
  EngineRun same_session = run_engine(daemon, with({"verify", "--session", "7"}));
  EXPECT_EQ(same_session.exit_code, 0) << same_session.output;
  auto r = restores_in(same_session.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full);
  EXPECT_EQ(r[0].reuse_kind, KVPARK_REUSE_PRIVATE_TURN_CLOSURE);

  EngineRun other_session = run_engine(daemon, with({"verify", "--session", "8"}));
  EXPECT_EQ(other_session.exit_code, 0) << other_session.output;
  r = restores_in(other_session.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full);
  EXPECT_EQ(r[0].reuse_kind, KVPARK_REUSE_SHARED_STABLE_PREFIX);

  // The conversation's next turn: a longer prompt restores everything parked.
  EngineRun next_turn = run_engine(
      daemon, small_blocks({"verify", "--session", "7", "--head-seed", "21", "--head-tokens",
                            "1024", "--body-seed", "22", "--body-tokens", "700"}));
  EXPECT_EQ(next_turn.exit_code, 0) << next_turn.output;
  r = restores_in(next_turn.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, 1324 / block_tokens * block_tokens);
  EXPECT_EQ(r[0].reuse_kind, KVPARK_REUSE_PRIVATE_TURN_CLOSURE);
}

TEST(EngineRestart, SharedClassIsSharedStablePrefixEvenForItsOwnSession) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  EngineRun publisher = run_engine(
      daemon, small_blocks({"publish", "--shared", "--session", "9", "--head-seed", "23"}));
  ASSERT_EQ(publisher.exit_code, 0) << publisher.output;
  EngineRun v = run_engine(daemon, small_blocks({"verify", "--session", "9", "--head-seed", "23"}));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full_restore_tokens(1024, block_tokens));
  EXPECT_EQ(r[0].reuse_kind, KVPARK_REUSE_SHARED_STABLE_PREFIX);
}

TEST(Namespaces, SameTokensInAnotherNamespaceRestoreNothing) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  EngineRun publisher = run_engine(daemon, small_blocks({"publish", "--ns", "1", "--head-seed", "31"}));
  ASSERT_EQ(publisher.exit_code, 0) << publisher.output;
  EXPECT_EQ(published_in(publisher.output), 16);

  EngineRun other = run_engine(daemon, small_blocks({"verify", "--ns", "2", "--head-seed", "31"}));
  EXPECT_EQ(other.exit_code, 0) << other.output;
  auto r = restores_in(other.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, 0u);
  EXPECT_EQ(r[0].reuse_kind, KVPARK_REUSE_ROOT);

  EngineRun own = run_engine(daemon, small_blocks({"verify", "--ns", "1", "--head-seed", "31"}));
  EXPECT_EQ(own.exit_code, 0) << own.output;
  r = restores_in(own.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full_restore_tokens(1024, block_tokens));

  // Namespace 2 parks its own copy: nothing was shared across the boundary.
  EngineRun second = run_engine(daemon, small_blocks({"publish", "--ns", "2", "--head-seed", "31"}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(published_in(second.output), 16);
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.get().blocks, 32u);

  // A namespace id is bound to one geometry.
  kvpark_status status = KVPARK_OK;
  ClientPtr wrong = connect_client(daemon.socket_path(),
                                   engine_namespace(1, block_tokens, block_bytes * 2), &status);
  EXPECT_EQ(status, KVPARK_GEOMETRY_MISMATCH);
  EXPECT_EQ(wrong, nullptr);
}

TEST(Deduplication, SameHeadPublishedByTwoProcessesIsStoredOnce) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  StatsClient stats(daemon.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats empty = stats.get();
  ASSERT_EQ(empty.blocks, 0u);

  EngineRun first = run_engine(daemon, small_blocks({"publish", "--head-seed", "41"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_EQ(published_in(first.output), 16);
  const kvpark_stats after_first = stats.get();
  EXPECT_EQ(after_first.blocks, 16u);
  ASSERT_LT(after_first.arena_free_bytes, empty.arena_free_bytes);
  const uint64_t extent_bytes = (empty.arena_free_bytes - after_first.arena_free_bytes) / 16;
  EXPECT_EQ(extent_bytes * 16, empty.arena_free_bytes - after_first.arena_free_bytes);

  EngineRun second = run_engine(daemon, small_blocks({"publish", "--head-seed", "41"}));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(published_in(second.output), 0);
  const kvpark_stats after_second = stats.get();
  EXPECT_EQ(after_second.blocks, 16u);
  EXPECT_EQ(after_second.arena_free_bytes, after_first.arena_free_bytes);
  EXPECT_EQ(after_second.dedup_hits - after_first.dedup_hits, 16u);

  // The same head under a new body: only the body's blocks take space.
  EngineRun third = run_engine(
      daemon, small_blocks({"publish", "--head-seed", "41", "--body-seed", "42", "--body-tokens", "128"}));
  ASSERT_EQ(third.exit_code, 0) << third.output;
  EXPECT_EQ(published_in(third.output), 2);
  const kvpark_stats after_third = stats.get();
  EXPECT_EQ(after_third.blocks, 18u);
  EXPECT_EQ(after_third.arena_free_bytes, after_first.arena_free_bytes - 2 * extent_bytes);
  EXPECT_EQ(after_third.dedup_hits - after_second.dedup_hits, 16u);

  EngineRun v = run_engine(
      daemon, small_blocks({"verify", "--head-seed", "41", "--body-seed", "42", "--body-tokens", "129"}));
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, 1152u);
}

}  // namespace
}  // namespace kvpark::testing
