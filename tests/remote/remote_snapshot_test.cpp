// Snapshots through the remote tier, real processes: a 3-master Redis Cluster on
// loopback and two kvparkd instances standing for hosts A and B, with engines of a
// snapshot-only namespace (block_tokens 0, as kvpark-proxy in front of llama-server)
// publishing and restoring through libkvpark's snapshot API. kvpark-test-engine
// checks every restored byte (exit 3 on a wrong one).
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "proto/xxh3.h"
#include "remote/record_layout.h"
#include "tests/remote/remote_hosts.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/eventually.h"

namespace kvpark::testing {
namespace {

// A head that ends inside its 16th chunk (chain 64): anchored at chunk 15 with a
// 40-token tail.
constexpr uint32_t head_tokens = 1000;
// More than two chunks of 4 MiB - 64: the snapshot is five keys and an index field.
constexpr uint64_t snapshot_bytes = 10ull << 20;
constexpr uint32_t snapshot_chunks = 3;

std::vector<std::string> engine_args(uint64_t seed, uint32_t head, uint32_t body,
                                     std::vector<std::string> more) {
  std::vector<std::string> args = {"--block-tokens", "0",
                                   "--head-seed",    std::to_string(seed),
                                   "--head-tokens",  std::to_string(head),
                                   "--body-tokens",  std::to_string(body)};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The head parked as a snapshot at its end (position head_tokens).
EngineRun publish(const Host& h, uint64_t seed, bool shared = true) {
  std::vector<std::string> more = {"--snapshot-bytes", std::to_string(snapshot_bytes), "publish"};
  if (shared) more.insert(more.begin(), "--shared");
  return run_engine(*h.daemon, engine_args(seed, head_tokens, 0, more));
}

// A sibling prompt: `head` tokens of the head, then `body` tokens of its own.
EngineRun verify(const Host& h, uint64_t seed, uint32_t head = head_tokens, uint32_t body = 100) {
  return run_engine(*h.daemon, engine_args(seed, head, body,
                                           {"--session", "9", "--wait-msec", "10000", "verify"}));
}

uint32_t restored(const EngineRun& run) {
  auto r = restores_in(run.output);
  return r.empty() ? 0 : r.back().tokens;
}

// The remote keys of snapshots (manifests, chunks, indexes) on every node.
std::vector<std::pair<size_t, std::string>> snapshot_keys(RedisCluster& cluster) {
  std::vector<std::pair<size_t, std::string>> keys;
  for (auto& k : remote_keys(cluster)) {
    if (k.second.find("}:s") != std::string::npos) keys.push_back(k);
  }
  return keys;
}

class RemoteSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(cluster_.start()) << cluster_.failure();
    a_ = std::make_unique<Host>(cluster_.seeds(), "remote-snap-a");
    b_ = std::make_unique<Host>(cluster_.seeds(), "remote-snap-b");
    ASSERT_TRUE(a_->daemon->start()) << a_->daemon->log_tail();
    ASSERT_TRUE(b_->daemon->start()) << b_->daemon->log_tail();
  }
  // Publishes a shared head snapshot on A and waits until it is in the store.
  void publish_on_a(uint64_t seed) {
    const uint64_t before = a_->status("remote_writes");
    ASSERT_EQ(publish(*a_, seed).exit_code, 0);
    ASSERT_TRUE(eventually("A wrote the snapshot behind to the store", [&] {
      return a_->status("remote_writes") >= before + 1;
    })) << a_->daemon->log_tail();
  }
  // The node and name of the one snapshot key with this suffix.
  std::pair<size_t, std::string> key_ending(const std::string& suffix) {
    std::pair<size_t, std::string> found{0, ""};
    for (auto& k : snapshot_keys(cluster_)) {
      if (k.second.ends_with(suffix)) found = k;
    }
    return found;
  }
  RedisCluster cluster_{3};
  std::unique_ptr<Host> a_;
  std::unique_ptr<Host> b_;
};

TEST_F(RemoteSnapshotTest, ASnapshotPublishedOnAIsRestoredByteExactOnBWithoutPrefill) {
  publish_on_a(1);
  // In the store: the chunks, the manifest, and the anchor's index, all on one node.
  const auto keys = snapshot_keys(cluster_);
  ASSERT_EQ(keys.size(), snapshot_chunks + 2) << keys.size();
  size_t chunks = 0, manifests = 0, indexes = 0;
  for (const auto& [node, key] : keys) {
    EXPECT_EQ(node, keys[0].first) << key;
    const std::string tail = key.substr(key.find("}:s") + 3);
    if (tail.empty()) {
      ++indexes;
      EXPECT_EQ(cluster_.node(node).cli({"HLEN", key}), "1\n");
    } else if (tail.find(':') == std::string::npos) {
      ++manifests;
      EXPECT_TRUE(tail.starts_with(std::to_string(head_tokens) + ".")) << key;
    } else {
      ++chunks;
    }
  }
  EXPECT_EQ(chunks, snapshot_chunks);
  EXPECT_EQ(manifests, 1u);
  EXPECT_EQ(indexes, 1u);
  // A sibling on B (the head, then a body of its own): the whole head restored, no
  // prefill of it, every byte checked by the engine.
  const EngineRun run = verify(*b_, 1);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), head_tokens) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_hits"), 1u);
  EXPECT_EQ(b_->status("remote_corrupt"), 0u);
  EXPECT_GE(b_->status("remote_bytes_in"), snapshot_bytes);
  // Now on B's host tier: another sibling restores it from there.
  const EngineRun again = verify(*b_, 1, head_tokens, 300);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(restored(again), head_tokens);
  EXPECT_EQ(b_->status("remote_hits"), 1u);
}

TEST_F(RemoteSnapshotTest, OnlySharedSnapshotsAreWrittenUnderTheSharedPolicy) {
  // A private snapshot, then a shared one: writes go in order, so once the shared one
  // is written, a private write would have been counted first.
  ASSERT_EQ(publish(*a_, 2, false).exit_code, 0);
  publish_on_a(3);
  EXPECT_EQ(a_->status("remote_writes"), 1u);
  const EngineRun run = verify(*b_, 2);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);
}

TEST_F(RemoteSnapshotTest, ACorruptedChunkIsAMissAndTheSnapshotIsDeleted) {
  publish_on_a(4);
  const auto [node, chunk] = key_ending(":1");
  ASSERT_FALSE(chunk.empty());
  cluster_.node(node).cli({"SETRANGE", chunk, "1000", "kvpark-was-here"});
  const EngineRun run = verify(*b_, 4);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);  // prefilled
  EXPECT_EQ(b_->status("remote_hits"), 0u);
  EXPECT_GE(b_->status("remote_corrupt"), 1u);
  // Manifest, chunks and its index field are gone from the store.
  EXPECT_TRUE(eventually("the damaged snapshot is deleted",
                         [&] { return snapshot_keys(cluster_).empty(); }));
}

TEST_F(RemoteSnapshotTest, AnIndexFieldWhoseManifestTheStoreEvictedIsAMissAndIsRemoved) {
  publish_on_a(5);
  const auto [node, index] = key_ending("}:s");
  ASSERT_FALSE(index.empty());
  // The store evicted the manifest (allkeys-lru); the index still lists it.
  std::string manifest_key;
  for (const auto& [n, k] : snapshot_keys(cluster_)) {
    const std::string tail = k.substr(k.find("}:s") + 3);
    if (!tail.empty() && tail.find(':') == std::string::npos) manifest_key = k;
  }
  ASSERT_FALSE(manifest_key.empty());
  ASSERT_EQ(cluster_.node(node).cli({"DEL", manifest_key}), "1\n");
  const EngineRun run = verify(*b_, 5);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);
  EXPECT_EQ(b_->status("remote_hits"), 0u);
  EXPECT_TRUE(eventually("the stale index field is removed", [&] {
    return cluster_.node(node).cli({"EXISTS", index}) == "0\n";
  }));
}

TEST_F(RemoteSnapshotTest, ATailPastThePromptsLastChunkIsCheckedBeforeAnythingIsFetched) {
  // Prompt of 1010 tokens: 15 whole chunks and a 50-token tail, of which the
  // snapshot's 40 are the first. The daemon compares them itself.
  publish_on_a(6);
  const EngineRun same = verify(*b_, 6, head_tokens, 10);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(restored(same), head_tokens) << same.output << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_hits"), 1u);
  // The same first 990 tokens, then others: the tail differs at token 990, and the
  // snapshot is not even fetched.
  publish_on_a(7);
  const uint64_t bytes_in = b_->status("remote_bytes_in");
  const EngineRun other = verify(*b_, 7, 990, 20);
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_EQ(restored(other), 0u);
  EXPECT_EQ(b_->status("remote_hits"), 1u);
  EXPECT_LT(b_->status("remote_bytes_in"), bytes_in + snapshot_bytes);
}

TEST_F(RemoteSnapshotTest, ATailInsideAWholeChunkThatDiffersIsRefusedByTheClient) {
  // The same first 990 tokens, then 200 others: the snapshot's tail lies in the
  // prompt's 16th whole chunk, which the daemon knows only by its hash. It is
  // restored to B, and the engine's tail check refuses it: nothing wrong is served.
  publish_on_a(8);
  const EngineRun other = verify(*b_, 8, 990, 200);
  EXPECT_EQ(other.exit_code, 0) << other.output;
  EXPECT_EQ(restored(other), 0u);
  EXPECT_EQ(b_->status("remote_hits"), 1u);  // fetched: the daemon could not tell
  // A sibling whose tail matches restores it from B's host tier.
  const EngineRun same = verify(*b_, 8);
  EXPECT_EQ(same.exit_code, 0) << same.output;
  EXPECT_EQ(restored(same), head_tokens);
}

TEST_F(RemoteSnapshotTest,
       TheNodeHoldingASnapshotKilledDuringItsRestoreIsAMissAndNothingWrongIsServed) {
  publish_on_a(10);
  const auto [node, index] = key_ending("}:s");
  ASSERT_FALSE(index.empty());
  ChildProcess engine = spawn_engine(
      *b_->daemon,
      engine_args(10, head_tokens, 100, {"--session", "9", "--wait-msec", "10000", "verify"}));
  ASSERT_GT(engine.pid, 0);
  // Kill the snapshot's master once B has asked the store (its restore may be in flight).
  ASSERT_TRUE(eventually("B probed the store", [&] { return b_->status("remote_probes") >= 1; }));
  cluster_.node(node).kill_hard();
  EXPECT_EQ(engine.wait_exit(20'000), 0) << "the engine found a wrong byte or failed\n"
                                         << b_->daemon->log_tail();
  // Whatever B did not finish it erased (a reservation left behind would hold the
  // next lookup in flight until its wait ran out): B's own engine parks the snapshot
  // there, or finds it restored, and a sibling restores it from B's host tier.
  EXPECT_EQ(run_engine(*b_->daemon, engine_args(10, head_tokens, 0,
                                                {"--shared", "--snapshot-bytes",
                                                 std::to_string(snapshot_bytes), "publish"}))
                .exit_code,
            0);
  const EngineRun local = verify(*b_, 10);
  EXPECT_EQ(local.exit_code, 0) << local.output;
  EXPECT_EQ(restored(local), head_tokens);
}

// A value whose checksums all agree but whose tail tokens are not the ones its key
// and index name (a buggy or hostile writer): the daemon's own tail check refuses it.
TEST_F(RemoteSnapshotTest, AValueWithAnotherTailUnderTheKeyIsRefusedByTheDaemon) {
  publish_on_a(9);
  std::string manifest_key;
  size_t node = 0;
  for (const auto& [n, k] : snapshot_keys(cluster_)) {
    const std::string tail = k.substr(k.find("}:s") + 3);
    if (!tail.empty() && tail.find(':') == std::string::npos) manifest_key = k, node = n;
  }
  ASSERT_FALSE(manifest_key.empty());
  const std::string port = std::to_string(cluster_.node(node).port());
  const auto get_raw = [&](const std::string& key) {
    std::string value;  // --raw: the value's bytes, then a newline
    EXPECT_EQ(run_process({redis_cli_path(), "-p", port, "--raw", "GET", key}, 10'000, &value), 0);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    return value;
  };
  const auto set_raw = [&](const std::string& key, const std::string& value) {
    const std::string path = a_->disk.path + "/value";
    std::ofstream(path, std::ios::binary) << value;
    std::string out;
    return run_process({"/bin/sh", "-c",
                        redis_cli_path() + " -p " + port + " -x SET '" + key + "' < " + path},
                       10'000, &out) == 0;
  };
  remote::Manifest m;
  ASSERT_EQ(remote::decode_manifest(get_raw(manifest_key), m), Status::Ok);
  std::string chunk = get_raw(manifest_key + ":0");
  ASSERT_EQ(chunk.size(), m.header.chunk_bytes);
  chunk[0] ^= 1;  // tail token 0
  m.chunk_checksums[0] = XXH3_64bits(chunk.data(), chunk.size());
  ASSERT_TRUE(set_raw(manifest_key + ":0", chunk));
  ASSERT_TRUE(set_raw(manifest_key, remote::encode_manifest(m)));
  const EngineRun run = verify(*b_, 9);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), 0u);
  EXPECT_EQ(b_->status("remote_hits"), 0u);
  EXPECT_GE(b_->status("remote_rejected"), 1u) << b_->daemon->log_tail();
}

// Hybrid namespaces (blocks and a required snapshot, as a model with attention and
// recurrent layers): a prompt restores only at a snapshot, over the blocks up to its
// anchor. The head of 1000 tokens is 15 blocks of 64 and a snapshot at 1000 anchored
// at chunk 15 (a 40-token tail).
constexpr uint32_t hybrid_blocks = head_tokens / 64;

// The head in a namespace of 64-token blocks: hybrid (a snapshot required) or
// attention-only (tests below).
std::vector<std::string> blocks_args(uint64_t seed, bool hybrid, std::vector<std::string> more) {
  std::vector<std::string> args = {"--block-tokens", "64", "--head-seed", std::to_string(seed),
                                   "--head-tokens", std::to_string(head_tokens)};
  if (hybrid) args.push_back("--hybrid");
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

class RemoteBlocksTest : public RemoteSnapshotTest {
 protected:
  explicit RemoteBlocksTest(bool hybrid) : hybrid_(hybrid) {}
  // Publishes the shared head on A (its blocks, and its snapshot unless blocks_only)
  // and waits until every entry is in the store.
  void publish_blocks_on_a(uint64_t seed, bool blocks_only = false) {
    const uint64_t before = a_->status("remote_writes");
    std::vector<std::string> more = {"--shared"};
    if (!blocks_only) more.insert(more.end(), {"--snapshot-bytes", std::to_string(snapshot_bytes)});
    more.push_back("publish");
    ASSERT_EQ(run_engine(*a_->daemon, blocks_args(seed, hybrid_, more)).exit_code, 0);
    const uint64_t entries = hybrid_blocks + (blocks_only ? 0 : 1);
    ASSERT_TRUE(eventually("A wrote its blocks and snapshot behind", [&] {
      return a_->status("remote_writes") >= before + entries;
    })) << a_->daemon->log_tail();
  }
  // One lookup and one kvpark_plan_wait, as an engine does.
  EngineRun verify_blocks(const Host& h, uint64_t seed, uint32_t body = 100) {
    return run_engine(*h.daemon, blocks_args(seed, hybrid_, {"--body-tokens", std::to_string(body),
                                                             "--session", "9", "--wait-msec",
                                                             "10000", "verify"}));
  }
  EngineRun publish_blocks_only_on(const Host& h, uint64_t seed) {
    return run_engine(*h.daemon, blocks_args(seed, hybrid_, {"publish"}));
  }

 private:
  const bool hybrid_;
};

class RemoteHybridTest : public RemoteBlocksTest {
 protected:
  RemoteHybridTest() : RemoteBlocksTest(/*hybrid=*/true) {}
};

TEST_F(RemoteHybridTest, AHybridHeadParkedOnAIsRestoredOnBWithItsBlocksAndSnapshotWithoutPrefill) {
  publish_blocks_on_a(11);
  const EngineRun run = verify_blocks(*b_, 11);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), head_tokens) << run.output << b_->daemon->log_tail();
  // Every block under the snapshot's anchor, and the snapshot: nothing else.
  EXPECT_EQ(b_->status("remote_hits"), hybrid_blocks + 1) << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_rejected"), 0u);
  EXPECT_GE(b_->status("remote_bytes_in"), snapshot_bytes);
  // On B's host tier now: another sibling restores from there.
  const EngineRun again = verify_blocks(*b_, 11, 300);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(restored(again), head_tokens);
  EXPECT_EQ(b_->status("remote_hits"), hybrid_blocks + 1);
}

// Blocks without their snapshot restore nothing: a B that fetched them would only
// fill its arena.
TEST_F(RemoteHybridTest, HybridBlocksWhoseSnapshotTheStoreDoesNotHaveAreNotFetched) {
  publish_blocks_on_a(12, /*blocks_only=*/true);
  const EngineRun run = verify_blocks(*b_, 12);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), 0u) << run.output;
  EXPECT_EQ(b_->status("remote_hits"), 0u);
  EXPECT_GE(b_->status("remote_probes"), 1u);  // it asked, and found no snapshot
}

TEST_F(RemoteHybridTest, OverBlocksBHasAlreadyOnlyTheHybridSnapshotIsFetched) {
  // B's own engine parked the head's blocks (no snapshot); A parked blocks and snapshot.
  ASSERT_EQ(publish_blocks_only_on(*b_, 13).exit_code, 0);
  publish_blocks_on_a(13);
  const EngineRun run = verify_blocks(*b_, 13);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), head_tokens) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_hits"), 1u) << b_->daemon->log_tail();
}

// A snapshot over a block the store lost (evicted) cannot be anchored: B fetches
// neither it nor the blocks before the gap, and its engine prefills.
TEST_F(RemoteHybridTest, AHybridSnapshotOverABlockTheStoreLostIsNotFetched) {
  publish_blocks_on_a(14);
  // The 8th block's manifest (chain index 7), found by decoding each block manifest.
  size_t removed = 0;
  for (const auto& [node, key] : remote_keys(cluster_)) {
    if (!key.ends_with("}:b")) continue;
    std::string value;  // --raw: the value's bytes, then a newline
    const std::string port = std::to_string(cluster_.node(node).port());
    ASSERT_EQ(run_process({redis_cli_path(), "-p", port, "--raw", "GET", key}, 10'000, &value), 0);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    remote::Manifest m;
    ASSERT_EQ(remote::decode_manifest(value, m), Status::Ok) << key;
    if (m.header.anchor_chunks == 7 && cluster_.node(node).cli({"DEL", key}) == "1\n") ++removed;
  }
  ASSERT_EQ(removed, 1u);
  const EngineRun run = verify_blocks(*b_, 14);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), 0u) << run.output;
  EXPECT_EQ(b_->status("remote_hits"), 0u) << b_->daemon->log_tail();
  EXPECT_GE(b_->status("remote_probes"), 1u);
}

// Attention-only namespaces (blocks, no required snapshot, as llama.cpp state parked
// as blocks by kvpark-proxy and the parker): the head's whole blocks restore on their
// own, and the tail snapshot past the last one (40 tokens at 1000) goes to the store
// too, so a sibling on B restores the head to its exact end.
class RemoteAttentionTailTest : public RemoteBlocksTest {
 protected:
  RemoteAttentionTailTest() : RemoteBlocksTest(/*hybrid=*/false) {}
};

TEST_F(RemoteAttentionTailTest, ATailInTheStoreRestoresTheHeadToItsExactEndInOneWait) {
  publish_blocks_on_a(21);
  const EngineRun run = verify_blocks(*b_, 21);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), head_tokens) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_hits"), hybrid_blocks + 1) << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_rejected"), 0u);
  // On B's host tier now: another sibling restores from there, asking the store nothing.
  const uint64_t probes = b_->status("remote_probes");
  const EngineRun again = verify_blocks(*b_, 21, 300);
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(restored(again), head_tokens);
  EXPECT_EQ(b_->status("remote_hits"), hybrid_blocks + 1);
  EXPECT_EQ(b_->status("remote_probes"), probes) << "the head is whole here";
}

TEST_F(RemoteAttentionTailTest, WithoutATailInTheStoreTheHeadsBlocksStillRestore) {
  publish_blocks_on_a(22, /*blocks_only=*/true);
  const EngineRun run = verify_blocks(*b_, 22);
  EXPECT_EQ(run.exit_code, 0) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(restored(run), hybrid_blocks * 64) << run.output << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_hits"), hybrid_blocks) << b_->daemon->log_tail();
  EXPECT_EQ(b_->status("remote_rejected"), 0u);
}

}  // namespace
}  // namespace kvpark::testing
