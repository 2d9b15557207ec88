// The remote library against real redis-server processes: one Redis, and a
// 3-master Redis Cluster on loopback (tests/testing/redis_process.h).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/xxh3.h"
#include "remote/cluster_client.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "remote/remote_store.h"
#include "remote/slot.h"
#include "tests/testing/eventually.h"
#include "tests/testing/redis_process.h"

namespace kvpark::remote {
namespace {

using testing::RedisCluster;
using testing::RedisConfig;
using testing::RedisProcess;

// Small chunks so a modest entry spans many keys and a chunk straddles tokens and payload.
constexpr uint32_t test_chunk_bytes = chunk_bytes_min;

struct TestEntry {
  EntryKey key;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
  ManifestHeader header() const {
    ManifestHeader h = manifest_header_for(key);
    h.payload_checksum = XXH3_64bits(payload.data(), payload.size());
    h.block_tokens = static_cast<uint32_t>(tokens.size());
    return h;
  }
  ImageView view() const {
    return {.tokens = reinterpret_cast<const uint8_t*>(tokens.data()),
            .tokens_bytes = tokens.size() * sizeof(int32_t),
            .payload = payload.data(),
            .payload_bytes = payload.size()};
  }
};

TestEntry make_entry(uint64_t n, size_t payload_bytes = 3 * test_chunk_bytes + 123) {
  TestEntry e;
  e.key = EntryKey{.ns = {0xfeed, 0xbeef}, .key_hash = {n * 0x9e3779b97f4a7c15ull, n}};
  e.tokens.resize(64);
  for (size_t i = 0; i < e.tokens.size(); ++i) e.tokens[i] = static_cast<int32_t>(n * 1000 + i);
  e.payload.resize(payload_bytes);
  std::mt19937_64 rng(n);
  for (auto& b : e.payload) b = static_cast<uint8_t>(rng());
  return e;
}

// Reads an entry back through probe + get; Ok only when it is byte-exact.
Status read_back(RemoteStore& store, const TestEntry& e) {
  std::vector<ProbeResult> found;
  store.probe({&e.key, 1}, found);
  if (found[0].status != Status::Ok) return found[0].status;
  const Manifest& m = found[0].manifest;
  std::vector<int32_t> tokens(m.header.token_count);
  std::vector<uint8_t> payload(m.header.payload_bytes);
  const ImageTarget target{.tokens = reinterpret_cast<uint8_t*>(tokens.data()),
                           .tokens_bytes = tokens.size() * sizeof(int32_t),
                           .payload = payload.data(),
                           .payload_bytes = payload.size()};
  if (Status s = store.get(e.key, m, target); s != Status::Ok) return s;
  return tokens == e.tokens && payload == e.payload ? Status::Ok : Status::Corrupt;
}

ClientOptions options_for(const std::string& seeds) {
  ClientOptions o;
  EXPECT_EQ(parse_endpoints(seeds, o.seeds), Status::Ok);
  return o;
}

class SingleRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(redis_.start()) << redis_.log_tail();
  }
  RedisProcess redis_;
};

TEST_F(SingleRedis, PutThenGetIsByteExactAcrossChunks) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(1);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  EXPECT_FALSE(client.cluster_mode());
  EXPECT_EQ(read_back(store, e), Status::Ok);
  // Manifest plus every chunk, nothing else.
  const uint32_t chunks = chunk_count_for(e.tokens.size() * 4 + e.payload.size(), test_chunk_bytes);
  EXPECT_EQ(redis_.cli({"DBSIZE"}), std::to_string(chunks + 1) + "\n");
}

TEST_F(SingleRedis, AnEntryAlreadyThereIsNotWrittenAgain) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(2);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  const uint64_t written = store.counters().bytes_written;
  EXPECT_EQ(store.put(e.key, e.header(), e.view()), Status::AlreadyPresent);
  EXPECT_EQ(store.counters().bytes_written, written);
}

TEST_F(SingleRedis, ProbeAnswersEveryKeyOfAChainInOneBatch) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  std::vector<EntryKey> keys;
  for (uint64_t i = 0; i < 256; ++i) {
    const TestEntry e = make_entry(100 + i, 100);
    if (i % 2 == 0) {
      ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
    }
    keys.push_back(e.key);
  }
  std::vector<ProbeResult> found;
  store.probe(keys, found);
  ASSERT_EQ(found.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(found[i].status, i % 2 == 0 ? Status::Ok : Status::NotFound) << i;
  }
}

// Small entries (one chunk each) restored in one pipelined batch: each answered as a
// get() would be, the damaged and the evicted ones misses and deleted, the rest exact.
TEST_F(SingleRedis, ABatchedGetRestoresEachEntryAndMissesOnlyTheDamagedOrGone) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, chunk_bytes_default);
  constexpr size_t entries = 6;
  std::vector<TestEntry> put;
  std::vector<EntryKey> keys;
  for (uint64_t i = 0; i < entries; ++i) {
    put.push_back(make_entry(300 + i, 16 * 1024 + i));
    ASSERT_EQ(store.put(put[i].key, put[i].header(), put[i].view()), Status::Ok);
    keys.push_back(put[i].key);
  }
  std::vector<ProbeResult> found;
  store.probe(keys, found);
  redis_.cli({"SETRANGE", chunk_key(keys[1], 0), "300", "kvpark-was-here"});  // damaged
  redis_.cli({"DEL", chunk_key(keys[4], 0)});                                 // evicted
  std::vector<std::vector<int32_t>> tokens(entries);
  std::vector<std::vector<uint8_t>> payloads(entries);
  std::vector<GetRequest> requests;
  for (size_t i = 0; i < entries; ++i) {
    ASSERT_EQ(found[i].status, Status::Ok);
    ASSERT_TRUE(batchable(found[i].manifest));
    tokens[i].resize(found[i].manifest.header.token_count);
    payloads[i].resize(found[i].manifest.header.payload_bytes);
    requests.push_back({.key = keys[i],
                        .manifest = &found[i].manifest,
                        .target = {.tokens = reinterpret_cast<uint8_t*>(tokens[i].data()),
                                   .tokens_bytes = tokens[i].size() * sizeof(int32_t),
                                   .payload = payloads[i].data(),
                                   .payload_bytes = payloads[i].size()}});
  }
  std::vector<Status> statuses;
  store.get_batch(requests, statuses);
  ASSERT_EQ(statuses.size(), entries);
  for (size_t i = 0; i < entries; ++i) {
    const Status want = i == 1 ? Status::Corrupt : i == 4 ? Status::NotFound : Status::Ok;
    EXPECT_EQ(statuses[i], want) << i;
    if (want == Status::Ok) {
      EXPECT_EQ(tokens[i], put[i].tokens) << i;
      EXPECT_EQ(payloads[i], put[i].payload) << i;
    } else {
      EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(keys[i])}), "0\n") << i;  // deleted
    }
  }
  EXPECT_EQ(store.counters().corrupt_values, 1u);
  // A large entry (several chunks) is not batchable: it streams chunk by chunk.
  const TestEntry big = make_entry(399, 2 * chunk_bytes_default);
  ASSERT_EQ(store.put(big.key, big.header(), big.view()), Status::Ok);
  store.probe({&big.key, 1}, found);
  ASSERT_EQ(found[0].status, Status::Ok);
  EXPECT_FALSE(batchable(found[0].manifest));
}

TEST_F(SingleRedis, ACorruptChunkIsAMissAndTheEntryIsDeleted) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(3);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  redis_.cli({"SETRANGE", chunk_key(e.key, 2), "10", "kvpark-was-here"});
  EXPECT_EQ(read_back(store, e), Status::Corrupt);
  EXPECT_EQ(store.counters().corrupt_values, 1u);
  EXPECT_EQ(redis_.cli({"DBSIZE"}), "0\n");
  // The next writer repairs it.
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  EXPECT_EQ(read_back(store, e), Status::Ok);
}

TEST_F(SingleRedis, ATruncatedChunkIsAMissAndTheEntryIsDeleted) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(4);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  redis_.cli({"SET", chunk_key(e.key, 1), "short"});
  EXPECT_EQ(read_back(store, e), Status::Corrupt);
  EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(e.key)}), "0\n");
}

TEST_F(SingleRedis, AnEvictedChunkIsAMissAndTheRestIsDeleted) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(5);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  redis_.cli({"DEL", chunk_key(e.key, 1)});
  EXPECT_EQ(read_back(store, e), Status::NotFound);
  EXPECT_EQ(redis_.cli({"DBSIZE"}), "0\n");
}

TEST_F(SingleRedis, AForeignOrDamagedManifestIsAMissAndDeleted) {
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry a = make_entry(6);
  const TestEntry b = make_entry(7);
  ASSERT_EQ(store.put(a.key, a.header(), a.view()), Status::Ok);
  // b's manifest key holding a's manifest: a foreign value.
  redis_.cli({"COPY", manifest_key(a.key), manifest_key(b.key)});
  EXPECT_EQ(read_back(store, b), Status::Corrupt);
  EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(b.key)}), "0\n");
  redis_.cli({"SET", manifest_key(b.key), "garbage"});
  EXPECT_EQ(read_back(store, b), Status::Corrupt);
  EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(b.key)}), "0\n");
  EXPECT_EQ(read_back(store, a), Status::Ok);
}

TEST_F(SingleRedis, TwoWritersOfOneEntryAtOnceLeaveItWhole) {
  const TestEntry e = make_entry(11, 40 * test_chunk_bytes);
  std::vector<Status> results(2);
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w) {
    writers.emplace_back([&, w] {
      ClusterClient client(options_for(redis_.address()));
      RemoteStore store(client, test_chunk_bytes);
      results[w] = store.put(e.key, e.header(), e.view());
    });
  }
  for (auto& t : writers) t.join();
  for (Status s : results) EXPECT_TRUE(s == Status::Ok || s == Status::AlreadyPresent);
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  EXPECT_EQ(read_back(store, e), Status::Ok);
}

TEST_F(SingleRedis, ADownStoreIsUnavailableAndIsPickedUpWhenItReturns) {
  ClientOptions o = options_for(redis_.address());
  ClusterClient client(o);
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(8);
  redis_.kill_hard();
  EXPECT_EQ(store.put(e.key, e.header(), e.view()), Status::Unavailable);
  EXPECT_EQ(read_back(store, e), Status::Unavailable);
  ASSERT_TRUE(redis_.start());
  EXPECT_TRUE(testing::eventually("the client reconnects after its backoff", [&] {
    return store.put(e.key, e.header(), e.view()) == Status::Ok;
  }));
  EXPECT_EQ(read_back(store, e), Status::Ok);
  EXPECT_GT(client.node_failures(), 0u);
}

TEST_F(SingleRedis, AFullStoreRefusesWritesAndSaysSo) {
  redis_.cli({"CONFIG", "SET", "maxmemory", "1"});  // below what it uses: every write is OOM
  redis_.cli({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  ClusterClient client(options_for(redis_.address()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(9);
  EXPECT_EQ(store.put(e.key, e.header(), e.view()), Status::IoError);
  EXPECT_EQ(store.counters().writes_refused, 1u);
  EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(e.key)}), "0\n");
}

TEST(RedisAuth, PasswordFromOptionsIsSentAndAWrongOneIsAMiss) {
  if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  RedisProcess redis(RedisConfig{.password = "s3cret"});
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  const TestEntry e = make_entry(10);
  {
    ClientOptions o = options_for(redis.address());
    o.password = "s3cret";
    ClusterClient client(o);
    RemoteStore store(client, test_chunk_bytes);
    ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
    EXPECT_EQ(read_back(store, e), Status::Ok);
  }
  {
    ClientOptions o = options_for(redis.address());
    o.user = "default";
    o.password = "s3cret";
    ClusterClient client(o);
    RemoteStore store(client, test_chunk_bytes);
    EXPECT_EQ(read_back(store, e), Status::Ok);  // ACL form: AUTH user password
  }
  ClientOptions o = options_for(redis.address());
  o.password = "wrong";
  ClusterClient client(o);
  RemoteStore store(client, test_chunk_bytes);
  EXPECT_EQ(read_back(store, e), Status::Unavailable);
}

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(cluster_.start()) << cluster_.failure();
  }
  // The node holding an existing key: the one that answers EXISTS (others say MOVED).
  size_t owner(const std::string& key) {
    for (size_t i = 0; i < cluster_.size(); ++i) {
      if (cluster_.node(i).cli({"EXISTS", key}) == "1\n") return i;
    }
    return SIZE_MAX;
  }
  std::string node_id(size_t i) {
    std::string id = cluster_.node(i).cli({"CLUSTER", "MYID"});
    while (!id.empty() && id.back() == '\n') id.pop_back();
    return id;
  }
  RedisCluster cluster_{3};
};

TEST_F(Cluster, EntriesSpreadOverEveryMasterAndReadBackByteExact) {
  ClusterClient client(options_for(cluster_.seeds()));
  RemoteStore store(client, test_chunk_bytes);
  std::vector<TestEntry> entries;
  for (uint64_t i = 0; i < 48; ++i) {
    entries.push_back(make_entry(1000 + i, 2 * test_chunk_bytes));
    ASSERT_EQ(store.put(entries.back().key, entries.back().header(), entries.back().view()), Status::Ok);
  }
  EXPECT_TRUE(client.cluster_mode());
  EXPECT_EQ(client.nodes_known(), 3u);
  EXPECT_EQ(client.redirects(), 0u);  // the slot map was right from the start
  for (size_t n = 0; n < cluster_.size(); ++n) {
    EXPECT_NE(cluster_.node(n).cli({"DBSIZE"}), "0\n") << "node " << n << " holds nothing";
  }
  for (const TestEntry& e : entries) EXPECT_EQ(read_back(store, e), Status::Ok);
}

TEST_F(Cluster, FollowsAskDuringMigrationAndMovedAfterIt) {
  ClusterClient client(options_for(cluster_.seeds()));
  RemoteStore store(client, test_chunk_bytes);
  const TestEntry e = make_entry(2000, 100);
  ASSERT_EQ(store.put(e.key, e.header(), e.view()), Status::Ok);
  const std::string key = manifest_key(e.key);
  const std::string slot = std::to_string(key_slot(key));
  const size_t from = owner(key);
  ASSERT_LT(from, cluster_.size());
  const size_t to = (from + 1) % cluster_.size();
  // Migrate the slot by hand: IMPORTING on the target, MIGRATING on the source.
  ASSERT_EQ(cluster_.node(to).cli({"CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(from)}), "OK\n");
  ASSERT_EQ(cluster_.node(from).cli({"CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(to)}), "OK\n");
  // A new entry in the same slot (same hash tag) goes to the target through ASK.
  TestEntry twin = make_entry(2001, 100);
  twin.key.snapshot = true;
  twin.key.key_hash = e.key.key_hash;  // same tag: same slot
  twin.key.position = 77;
  twin.key.tail_digest = tail_digest_of(twin.tokens);  // a snapshot's key names its tail
  ASSERT_EQ(store.put(twin.key, twin.header(), twin.view()), Status::Ok);
  EXPECT_GT(client.redirects(), 0u);
  // Its keys (manifest, chunk and its anchor's index) are on the target, the old
  // entry's still on the source.
  EXPECT_EQ(cluster_.node(to).cli({"CLUSTER", "COUNTKEYSINSLOT", slot}), "3\n");
  EXPECT_EQ(cluster_.node(from).cli({"CLUSTER", "COUNTKEYSINSLOT", slot}), "2\n");
  // Move the old keys and hand the slot over: the client's map is stale, MOVED fixes it.
  std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(cluster_.node(to).port()),
                                      "", "0", "5000", "KEYS"};
  const std::string keys_text = cluster_.node(from).cli({"CLUSTER", "GETKEYSINSLOT", slot, "100"});
  std::istringstream keys(keys_text);
  for (std::string k; std::getline(keys, k);) {
    if (!k.empty()) migrate.push_back(k);
  }
  ASSERT_GT(migrate.size(), 7u);
  EXPECT_EQ(cluster_.node(from).cli(migrate), "OK\n") << keys_text << " from " << cluster_.node(from).address();
  for (size_t n = 0; n < cluster_.size(); ++n) {
    cluster_.node(n).cli({"CLUSTER", "SETSLOT", slot, "NODE", node_id(to)});
  }
  const uint64_t before = client.redirects();
  EXPECT_EQ(read_back(store, e), Status::Ok);
  EXPECT_EQ(read_back(store, twin), Status::Ok);
  EXPECT_GT(client.redirects(), before);
  EXPECT_EQ(client.owner_of_slot(static_cast<uint16_t>(std::stoi(slot))), cluster_.node(to).address());
}

TEST_F(Cluster, AKilledNodeIsAMissForItsKeysOnlyAndRejoins) {
  ClientOptions o = options_for(cluster_.seeds());
  ClusterClient client(o);
  RemoteStore store(client, test_chunk_bytes);
  std::vector<TestEntry> entries;
  for (uint64_t i = 0; i < 30; ++i) {
    entries.push_back(make_entry(3000 + i, 100));
    ASSERT_EQ(store.put(entries.back().key, entries.back().header(), entries.back().view()), Status::Ok);
  }
  const std::string victim = cluster_.node(1).address();
  cluster_.node(1).kill_hard();
  std::vector<EntryKey> keys;
  for (const TestEntry& e : entries) keys.push_back(e.key);
  std::vector<ProbeResult> found;
  store.probe(keys, found);
  size_t missed = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const bool on_victim = client.owner_of_slot(key_slot(manifest_key(keys[i]))) == victim;
    EXPECT_EQ(found[i].status, on_victim ? Status::Unavailable : Status::Ok) << i;
    missed += on_victim;
  }
  EXPECT_GT(missed, 0u);
  EXPECT_LT(missed, keys.size());
  // Restarted with its nodes.conf, the node rejoins with its slots (its data is gone:
  // nothing is persisted), and its keys answer again: misses, never errors.
  ASSERT_TRUE(cluster_.node(1).start());
  EXPECT_TRUE(testing::eventually("the restarted node answers", [&] {
    store.probe(keys, found);
    for (const ProbeResult& r : found) {
      if (r.status == Status::Unavailable) return false;
    }
    return true;
  }));
}

}  // namespace
}  // namespace kvpark::remote
