// Snapshot-only namespaces (block_tokens 0, e.g. llama.cpp sequence state): a
// snapshot parked by one process restores bit-exact in another, and only for a
// prompt that carries its exact tokens up to its position.
//
// The snapshot sits at position 1037 = 16 hash chunks of 64 tokens + a 13-token
// tail; the head (1030 tokens) ends inside that tail.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint64_t ns_low = 8;
constexpr size_t head_tokens = 1030;
constexpr size_t body_tokens = 7;
constexpr uint32_t position = head_tokens + body_tokens;
constexpr uint64_t snapshot_bytes = 100'003;  // not a multiple of 8 on purpose

std::vector<std::string> snapshot_args(std::vector<std::string> args, uint64_t body_seed,
                                       size_t body) {
  args.insert(args.end(), {"--ns", to_string(ns_low), "--block-tokens", "0", "--head-seed", "81",
                           "--head-tokens", to_string(head_tokens), "--body-seed",
                           to_string(body_seed), "--body-tokens", to_string(body),
                           "--snapshot-bytes", to_string(snapshot_bytes)});
  return args;
}

Restore verify(const DaemonProcess& daemon, uint64_t session, uint64_t body_seed, size_t body) {
  EngineRun v = run_engine(daemon, snapshot_args({"verify", "--session", to_string(session)},
                                                 body_seed, body));
  EXPECT_EQ(v.exit_code, 0) << v.output;  // 3: the snapshot's bytes differ
  const auto r = restores_in(v.output);
  EXPECT_EQ(r.size(), 1u);
  return r.empty() ? Restore{} : r[0];
}

class SnapshotOnly : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(daemon_.start());
    EngineRun p = run_engine(daemon_, snapshot_args({"publish", "--session", "3"}, 82, body_tokens));
    ASSERT_EQ(p.exit_code, 0) << p.output;
  }
  DaemonProcess daemon_;
};

TEST_F(SnapshotOnly, AnotherProcessRestoresTheSnapshotBitExact) {
  // A later turn of the same conversation: the prompt extends the parked one.
  Restore r = verify(daemon_, 3, 82, body_tokens + 50);
  EXPECT_EQ(r.tokens, position);
  EXPECT_EQ(r.reuse_kind, KVPARK_REUSE_PRIVATE_TURN_CLOSURE);
  r = verify(daemon_, 4, 82, body_tokens + 1);
  EXPECT_EQ(r.tokens, position);
  EXPECT_EQ(r.reuse_kind, KVPARK_REUSE_SHARED_STABLE_PREFIX);
  // The very same prompt must leave a token to prefill: nothing restorable.
  EXPECT_EQ(verify(daemon_, 3, 82, body_tokens).tokens, 0u);

  // Publishing it again stores nothing new.
  StatsClient stats(daemon_.socket_path());
  ASSERT_TRUE(stats.ok());
  const kvpark_stats before = stats.get();
  EXPECT_EQ(before.snapshots, 1u);
  EngineRun again = run_engine(daemon_, snapshot_args({"publish", "--session", "5"}, 82, body_tokens));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  const kvpark_stats after = stats.get();
  EXPECT_EQ(after.snapshots, 1u);
  EXPECT_EQ(after.arena_free_bytes, before.arena_free_bytes);
}

TEST_F(SnapshotOnly, PromptDifferingInTheTailDoesNotRestoreIt) {
  // Diverges at token 1030, inside the snapshot's tail. With 17 more tokens the
  // prompt ends in the same chunk (the daemon compares the tail); with 100 it
  // spans a further chunk (the client confirms the tail against the arena).
  EXPECT_EQ(verify(daemon_, 3, 83, 17).tokens, 0u);
  EXPECT_EQ(verify(daemon_, 3, 83, 100).tokens, 0u);

  // In process: only the snapshot's last tail token differs.
  ClientPtr client = connect_client(daemon_.socket_path(), engine_namespace(ns_low, 0, 0));
  ASSERT_NE(client, nullptr);
  for (size_t extra : {size_t{5}, size_t{200}}) {
    SCOPED_TRACE("prompt of " + to_string(position + extra) + " tokens");
    std::vector<int32_t> tokens = engine_prompt(81, head_tokens, 82, body_tokens + extra);
    kvpark_plan* plan = nullptr;
    ASSERT_EQ(kvpark_lookup(client.get(), 3, tokens.data(), tokens.size(), &plan), KVPARK_OK);
    EXPECT_EQ(kvpark_plan_restorable_tokens(plan), position);
    uint64_t bytes = 0;
    uint32_t at = 0;
    EXPECT_NE(kvpark_plan_snapshot(plan, &bytes, &at), nullptr);
    EXPECT_EQ(bytes, snapshot_bytes);
    EXPECT_EQ(at, position);
    kvpark_plan_release(plan);

    tokens[position - 1] = (tokens[position - 1] + 1) % 50000;
    ASSERT_EQ(kvpark_lookup(client.get(), 3, tokens.data(), tokens.size(), &plan), KVPARK_OK);
    EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 0u);
    EXPECT_EQ(kvpark_plan_snapshot(plan, nullptr, nullptr), nullptr);
    EXPECT_EQ(kvpark_plan_reuse_kind(plan), KVPARK_REUSE_ROOT);
    kvpark_plan_release(plan);
  }
  StatsClient stats(daemon_.socket_path());
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats.get().leases, 0u);
}

}  // namespace
}  // namespace kvpark::testing
