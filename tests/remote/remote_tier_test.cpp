// The remote tier through real processes: a 3-master Redis Cluster on loopback and
// two kvparkd instances (separate arenas and disk directories) standing for two
// hosts A and B. Every restore is checked byte for byte by kvpark-test-engine.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "proto/xxh3.h"
#include "remote/record_layout.h"
#include "tests/remote/remote_hosts.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/eventually.h"

namespace kvpark::testing {
namespace {

constexpr uint32_t block_tokens = 64;
constexpr uint32_t head_tokens = 1024;  // 16 blocks of 64 KiB
constexpr uint32_t blocks_per_head = head_tokens / block_tokens;
const uint32_t full = full_restore_tokens(head_tokens, block_tokens);

std::vector<std::string> head_args(uint64_t seed, std::vector<std::string> more) {
  std::vector<std::string> args = {"--head-seed", std::to_string(seed), "--head-tokens",
                                   std::to_string(head_tokens), "--block-bytes", "65536"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

EngineRun publish(const Host& h, uint64_t seed) {
  return run_engine(*h.daemon, head_args(seed, {"--shared", "publish"}));
}

EngineRun publish_private(const Host& h, uint64_t seed) {
  return run_engine(*h.daemon, head_args(seed, {"publish"}));
}

EngineRun verify(const Host& h, uint64_t seed) {
  return run_engine(*h.daemon, head_args(seed, {"--session", "9", "--wait-msec", "10000", "verify"}));
}

uint32_t restored(const EngineRun& run) {
  auto r = restores_in(run.output);
  return r.empty() ? 0 : r.back().tokens;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(cluster_.start()) << cluster_.failure();
    a_ = std::make_unique<Host>(cluster_.seeds(), "remote-a");
    b_ = std::make_unique<Host>(cluster_.seeds(), "remote-b");
    ASSERT_TRUE(a_->daemon->start()) << a_->daemon->log_tail();
    ASSERT_TRUE(b_->daemon->start()) << b_->daemon->log_tail();
  }
  // Publishes a shared head on A and waits until all of it is in the store.
  void publish_on_a(uint64_t seed) {
    const uint64_t before = a_->status("remote_writes");
    ASSERT_EQ(publish(*a_, seed).exit_code, 0);
    ASSERT_TRUE(eventually("A wrote the head behind to the store", [&] {
      return a_->status("remote_writes") >= before + blocks_per_head;
    })) << a_->daemon->log_tail();
  }
  RedisCluster cluster_{3};
  std::unique_ptr<Host> a_;
  std::unique_ptr<Host> b_;
};

TEST_F(RemoteTierTest, AHeadPublishedOnAIsRestoredByteExactOnBWithoutPrefill) {
  publish_on_a(1);
  EXPECT_EQ(a_->status("remote_cluster"), 1u);
  EXPECT_EQ(a_->status("remote_nodes_known"), 3u);
  // Its blocks spread over the masters.
  size_t nodes_used = 0;
  for (size_t n = 0; n < cluster_.size(); ++n) nodes_used += cluster_.node(n).cli({"DBSIZE"}) != "0\n";
  EXPECT_GE(nodes_used, 2u);
  const EngineRun run = verify(*b_, 1);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), full) << run.output << b_->daemon->log_tail();
  EXPECT_GE(b_->status("remote_hits"), full / block_tokens);
  EXPECT_EQ(b_->status("remote_corrupt"), 0u);
  // Once on B's host tier, the next restore there asks nobody.
  const uint64_t probes = b_->status("remote_probes");
  const EngineRun again = verify(*b_, 1);
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(restored(again), full);
  EXPECT_EQ(b_->status("remote_probes"), probes);
  EXPECT_NE(b_->metrics().find("kvpark_remote_hits_total"), std::string::npos);

  // An engine that does not wait gets what is here now; the store's blocks still land
  // for its next lookup.
  publish_on_a(6);
  const EngineRun first = run_engine(*b_->daemon, head_args(6, {"--session", "9", "verify"}));
  EXPECT_EQ(first.exit_code, 0) << first.output;
  EXPECT_TRUE(eventually("the next lookup on B restores the whole head", [&] {
    const EngineRun next = run_engine(*b_->daemon, head_args(6, {"--session", "9", "verify"}));
    EXPECT_EQ(next.exit_code, 0) << next.output;
    return restored(next) == full;
  })) << b_->daemon->log_tail();
}

TEST_F(RemoteTierTest, ANodeKilledDuringARestoreIsAMissAndNothingWrongIsServed) {
  publish_on_a(2);
  ChildProcess engine = spawn_engine(*b_->daemon, head_args(2, {"--session", "9", "--wait-msec",
                                                                "10000", "verify"}));
  ASSERT_GT(engine.pid, 0);
  // Kill a master once B has asked the store (its restores may be in flight).
  ASSERT_TRUE(eventually("B probed the store", [&] { return b_->status("remote_probes") >= 1; }));
  cluster_.node(1).kill_hard();
  EXPECT_EQ(engine.wait_exit(20'000), 0) << "the engine found a wrong byte or failed\n"
                                         << b_->daemon->log_tail();
  // What B restored it verified; whatever was on the dead node is prefilled instead.
  // B keeps serving locally, and another head misses the dead node, never errs.
  const EngineRun run = verify(*b_, 3);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(publish(*b_, 4).exit_code, 0);
  const EngineRun local = verify(*b_, 4);
  EXPECT_EQ(local.exit_code, 0);
  EXPECT_EQ(restored(local), full);
  const EngineRun partial = verify(*b_, 2);
  EXPECT_EQ(partial.exit_code, 0) << partial.output;
  EXPECT_LE(restored(partial), full);
  // A cluster with a master down is degraded, not down: no flapping state lines.
  const std::string log = read_file(b_->daemon->log_path());
  EXPECT_EQ(log.find("unreachable; lookups miss it"), std::string::npos) << log;
}

TEST_F(RemoteTierTest, ACorruptedValueIsAMissAndIsDeleted) {
  publish_on_a(5);
  // Damage every block's first chunk: not one of them may be served.
  size_t damaged = 0;
  for (const auto& [node, key] : remote_keys(cluster_)) {
    if (key.ends_with(":b:0")) {
      cluster_.node(node).cli({"SETRANGE", key, "100", "kvpark-was-here"});
      ++damaged;
    }
  }
  ASSERT_EQ(damaged, blocks_per_head);
  const EngineRun run = verify(*b_, 5);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);  // the chain's first block is damaged: nothing restorable
  EXPECT_GE(b_->status("remote_corrupt"), 1u);
  EXPECT_EQ(b_->status("remote_hits"), 0u);
  // The damaged entry's keys are gone from the store.
  EXPECT_TRUE(eventually("the damaged entry is deleted", [&] {
    return remote_keys(cluster_).size() < blocks_per_head * 2;
  }));
}

TEST(RemoteTierStartup, AStoreDownAtStartLeavesLocalServiceAndIsPickedUpWhenItAppears) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  redis.kill_hard();  // down, but its address is known
  const std::string seeds = "redis://" + redis.address();
  Host a(seeds, "remote-down-a");
  Host b(seeds, "remote-down-b");
  ASSERT_TRUE(a.daemon->start()) << a.daemon->log_tail();
  ASSERT_TRUE(b.daemon->start()) << b.daemon->log_tail();
  ASSERT_EQ(publish(a, 10).exit_code, 0);
  const EngineRun local = verify(a, 10);
  EXPECT_EQ(local.exit_code, 0);
  EXPECT_EQ(restored(local), full);
  const EngineRun miss = verify(b, 10);
  EXPECT_EQ(miss.exit_code, 0);
  EXPECT_EQ(restored(miss), 0u);
  EXPECT_EQ(a.status("remote_up"), 0u);
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  // A notices the store is back (a write-behind or a lookup retries it)...
  uint64_t seed = 11;
  ASSERT_TRUE(eventually("A reaches the store again", [&] {
    EXPECT_EQ(publish(a, seed++).exit_code, 0);
    return a.status("remote_up") == 1;
  })) << a.daemon->log_tail();
  // ...and from then on writes what it publishes.
  const uint64_t before = a.status("remote_writes");
  ASSERT_EQ(publish(a, seed).exit_code, 0);
  ASSERT_TRUE(eventually("A wrote the new head behind", [&] {
    return a.status("remote_writes") >= before + blocks_per_head;
  })) << a.daemon->log_tail();
  // Writes of the heads published while A reconnected may still be landing: B restores
  // what is there, byte-exact, and the whole head once all of it is.
  ASSERT_TRUE(eventually("B restores the whole head from the store", [&] {
    const EngineRun run = verify(b, seed);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    return restored(run) == full;
  })) << b.daemon->log_tail();
  EXPECT_GE(b.status("remote_hits"), 1u);
  // One log line per state change, not one per failed job.
  const std::string log = read_file(a.daemon->log_path());
  size_t unreachable = 0;
  const std::string down = "unreachable; lookups miss it";
  for (size_t at = log.find(down); at != std::string::npos; at = log.find(down, at + 1)) ++unreachable;
  EXPECT_LE(unreachable, 1u) << log;
  EXPECT_NE(log.find(redis.address() + " reachable"), std::string::npos) << log;
}

TEST(RemoteTierPolicy, SharedWritesOnlySharedBlocksAndAllWritesPrivateOnesToo) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  const std::string seeds = "redis://" + redis.address();
  Host shared(seeds, "remote-policy-shared");
  Host all(seeds, "remote-policy-all", "all");
  Host off(seeds, "remote-policy-off", "off");
  ASSERT_TRUE(shared.daemon->start()) << shared.daemon->log_tail();
  ASSERT_TRUE(all.daemon->start()) << all.daemon->log_tail();
  ASSERT_TRUE(off.daemon->start()) << off.daemon->log_tail();
  // A private head, then a shared one: writes go in order, so once the shared head is
  // written, a private write would have been counted first.
  ASSERT_EQ(publish_private(shared, 20).exit_code, 0);
  ASSERT_EQ(publish_private(off, 21).exit_code, 0);
  ASSERT_EQ(publish(off, 22).exit_code, 0);
  ASSERT_EQ(publish(shared, 23).exit_code, 0);
  ASSERT_TRUE(eventually("the shared head is written", [&] {
    return shared.status("remote_writes") >= blocks_per_head;
  }));
  EXPECT_EQ(shared.status("remote_writes"), blocks_per_head);
  EXPECT_EQ(off.status("remote_writes"), 0u);
  EXPECT_EQ(redis.cli({"DBSIZE"}), std::to_string(2 * blocks_per_head) + "\n");  // manifest + chunk
  ASSERT_EQ(publish_private(all, 24).exit_code, 0);
  EXPECT_TRUE(eventually("policy all writes a private head", [&] {
    return all.status("remote_writes") >= blocks_per_head;
  }));
  // Written by one host, present for another: not written twice.
  ASSERT_EQ(publish(all, 23).exit_code, 0);
  EXPECT_TRUE(eventually("the second writer finds it present", [&] {
    return all.status("remote_writes_present") >= blocks_per_head;
  }));
}

TEST(RemoteTierFull, AStoreThatRefusesWritesIsCountedAndLocalServiceGoesOn) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis(RedisConfig{.extra_args = {"--maxmemory", "1mb", "--maxmemory-policy",
                                                "noeviction"}});
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  Host a("redis://" + redis.address(), "remote-full-a");
  ASSERT_TRUE(a.daemon->start()) << a.daemon->log_tail();
  ASSERT_EQ(publish(a, 30).exit_code, 0);
  ASSERT_EQ(publish(a, 31).exit_code, 0);
  EXPECT_TRUE(eventually("the store's refusals are counted", [&] {
    return a.status("remote_writes_refused") >= 1 && a.status("remote_writes_failed") >= 1;
  })) << a.daemon->log_tail();
  EXPECT_EQ(a.status("remote_up"), 1u);  // refusing is an answer: the store is up
  const EngineRun local = verify(a, 31);
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(restored(local), full);
}

// A store that accepts connections but never answers (stopped): lookups are answered at
// once with what is local, an engine that waits is released by the check's budget, and
// local publishing and restoring go on.
TEST(RemoteTierSlow, AStoreThatHangsDelaysNothingLocal) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  const std::string seeds = "redis://" + redis.address();
  Host a(seeds, "remote-slow-a");
  ASSERT_TRUE(a.daemon->start()) << a.daemon->log_tail();
  ASSERT_EQ(publish(a, 50).exit_code, 0);  // the store is up: connections are made
  ASSERT_TRUE(eventually("A wrote the head", [&] { return a.status("remote_writes") >= blocks_per_head; }));
  ASSERT_EQ(kill(redis.pid(), SIGSTOP), 0);
  ASSERT_EQ(publish(a, 51).exit_code, 0);
  const EngineRun local = verify(a, 51);
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(restored(local), full);
  // A head nobody has: the engine waits, the check's budget (or the socket timeout)
  // ends the wait, and nothing is restored.
  const EngineRun miss = verify(a, 52);
  EXPECT_EQ(miss.exit_code, 0) << miss.output;
  EXPECT_EQ(restored(miss), 0u);
  EXPECT_TRUE(eventually("the hang is counted", [&] { return a.status("remote_errors") >= 1; }));
  ASSERT_EQ(kill(redis.pid(), SIGCONT), 0);
  const EngineRun again = verify(a, 50);
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_EQ(restored(again), full);
}

// A value whose checksums all agree but whose token ids are not the ones its key names
// (a buggy or hostile writer): the daemon's own chain-hash check refuses it.
TEST(RemoteTierTokens, AValueWithOtherTokensUnderTheKeyIsRefusedByTheChainHash) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  const std::string seeds = "redis://" + redis.address();
  Host a(seeds, "remote-tokens-a");
  Host b(seeds, "remote-tokens-b");
  ASSERT_TRUE(a.daemon->start()) << a.daemon->log_tail();
  ASSERT_TRUE(b.daemon->start()) << b.daemon->log_tail();
  ASSERT_EQ(publish(a, 40).exit_code, 0);
  ASSERT_TRUE(eventually("A wrote the head", [&] { return a.status("remote_writes") >= blocks_per_head; }));
  // Rewrite the chain's first block: one token id changed, chunk and manifest checksums
  // recomputed so every checksum agrees.
  std::istringstream keys(redis.cli({"KEYS", "kvpark:r1:*:b"}));
  bool rewritten = false;
  for (std::string key; std::getline(keys, key) && !rewritten;) {
    if (key.empty()) continue;
    std::string manifest_text;  // --raw: the value's bytes, then a newline
    ASSERT_EQ(run_process({redis_cli_path(), "-p", std::to_string(redis.port()), "--raw", "GET", key},
                          10'000, &manifest_text),
              0);
    if (!manifest_text.empty() && manifest_text.back() == '\n') manifest_text.pop_back();
    remote::Manifest m;
    if (remote::decode_manifest(manifest_text, m) != Status::Ok || m.header.anchor_chunks != 0) continue;
    std::string chunk;
    ASSERT_EQ(run_process({redis_cli_path(), "-p", std::to_string(redis.port()), "--raw", "GET",
                           key + ":0"},
                          10'000, &chunk),
              0);
    if (!chunk.empty() && chunk.back() == '\n') chunk.pop_back();
    ASSERT_GE(chunk.size(), 4u);
    chunk[0] ^= 1;  // token 0
    m.chunk_checksums[0] = XXH3_64bits(chunk.data(), chunk.size());
    const std::string manifest = remote::encode_manifest(m);
    // Write both back byte-exact with redis-cli -x (the value from stdin).
    const auto set_from_stdin = [&](const std::string& k, const std::string& v) {
      const std::string path = a.disk.path + "/value";
      std::ofstream(path, std::ios::binary) << v;
      std::string out;
      return run_process({"/bin/sh", "-c",
                          redis_cli_path() + " -p " + std::to_string(redis.port()) + " -x SET '" + k +
                              "' < " + path},
                         10'000, &out) == 0;
    };
    ASSERT_TRUE(set_from_stdin(key + ":0", chunk));
    ASSERT_TRUE(set_from_stdin(key, manifest));
    rewritten = true;
  }
  ASSERT_TRUE(rewritten) << "no manifest of the chain's first block found";
  const EngineRun run = verify(b, 40);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);  // the first block is refused: nothing restorable
  EXPECT_GE(b.status("remote_rejected"), 1u) << b.daemon->log_tail();
}

}  // namespace
}  // namespace kvpark::testing
