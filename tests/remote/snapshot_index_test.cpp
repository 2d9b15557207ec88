// Snapshots in the store: chunks, manifest and their anchor's index field, against a
// real redis-server (tests/testing/redis_process.h).
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "proto/xxh3.h"
#include "remote/cluster_client.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "remote/remote_store.h"
#include "remote/slot.h"
#include "tests/testing/redis_process.h"

namespace kvpark::remote {
namespace {

using testing::RedisProcess;

constexpr uint32_t test_chunk_bytes = chunk_bytes_min;
const NamespaceId test_ns{0x5a, 0x5b};

struct TestSnapshot {
  EntryKey key;
  std::vector<int32_t> tail;
  std::vector<uint8_t> payload;
  ManifestHeader header() const {
    ManifestHeader h = manifest_header_for(key);
    h.payload_checksum = XXH3_64bits(payload.data(), payload.size());
    h.chain_tokens = 64;
    h.anchor_chunks = (key.position - static_cast<uint32_t>(tail.size())) / 64;
    return h;
  }
  ImageView view() const {
    return {.tokens = reinterpret_cast<const uint8_t*>(tail.data()),
            .tokens_bytes = tail.size() * sizeof(int32_t),
            .payload = payload.data(),
            .payload_bytes = payload.size()};
  }
};

// A snapshot at anchor `anchor` (its chunk count `chunks`) with a tail of `tail_tokens`.
TestSnapshot make_snapshot(uint64_t anchor, uint32_t chunks, uint32_t tail_tokens,
                           size_t payload_bytes = 5 * test_chunk_bytes + 17) {
  TestSnapshot s;
  for (uint32_t i = 0; i < tail_tokens; ++i)
    s.tail.push_back(static_cast<int32_t>(anchor * 100 + i));
  s.key = EntryKey{.ns = test_ns,
                   .key_hash = {anchor, anchor * 31},
                   .snapshot = true,
                   .position = chunks * 64 + tail_tokens,
                   .tail_digest = tail_digest_of(s.tail)};
  s.payload.resize(payload_bytes);
  std::mt19937_64 rng(anchor);
  for (auto& b : s.payload) b = static_cast<uint8_t>(rng());
  return s;
}

ClientOptions options_for(const std::string& seeds) {
  ClientOptions o;
  EXPECT_EQ(parse_endpoints(seeds, o.seeds), Status::Ok);
  return o;
}

class SnapshotIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_TRUE(redis_.start()) << redis_.log_tail();
    client_ = std::make_unique<ClusterClient>(options_for(redis_.address()));
    store_ = std::make_unique<RemoteStore>(*client_, test_chunk_bytes);
  }
  IndexResult index_of(const TestSnapshot& s) {
    std::vector<IndexResult> r;
    const EntryKey anchor{.ns = s.key.ns, .key_hash = s.key.key_hash};
    store_->probe_index({&anchor, 1}, r);
    return r.at(0);
  }
  std::string index_length(const TestSnapshot& s) {
    return redis_.cli({"HLEN", snapshot_index_key(s.key)});
  }
  RedisProcess redis_;
  std::unique_ptr<ClusterClient> client_;
  std::unique_ptr<RemoteStore> store_;
};

TEST_F(SnapshotIndex, APutSnapshotIsListedWithItsTailAndReadsBackByteExact) {
  const TestSnapshot s = make_snapshot(1, 3, 40);
  const TestSnapshot other = make_snapshot(1, 3, 7);  // same anchor, another tail
  ASSERT_EQ(store_->put(s.key, s.header(), s.view()), Status::Ok);
  ASSERT_EQ(store_->put(other.key, other.header(), other.view()), Status::Ok);
  const IndexResult r = index_of(s);
  ASSERT_EQ(r.status, Status::Ok);
  ASSERT_EQ(r.members.size(), 2u);
  for (const IndexMember& m : r.members) {
    const TestSnapshot& want = m.key.position == s.key.position ? s : other;
    EXPECT_EQ(m.key, want.key);
    EXPECT_EQ(m.tail_tokens, want.tail);
  }
  // The manifest and chunks of the key the field names.
  std::vector<ProbeResult> found;
  store_->probe({&s.key, 1}, found);
  ASSERT_EQ(found[0].status, Status::Ok);
  std::vector<int32_t> tail(found[0].manifest.header.token_count);
  std::vector<uint8_t> payload(found[0].manifest.header.payload_bytes);
  const ImageTarget target{.tokens = reinterpret_cast<uint8_t*>(tail.data()),
                           .tokens_bytes = tail.size() * sizeof(int32_t),
                           .payload = payload.data(),
                           .payload_bytes = payload.size()};
  ASSERT_EQ(store_->get(s.key, found[0].manifest, target), Status::Ok);
  EXPECT_EQ(tail, s.tail);
  EXPECT_EQ(payload, s.payload);
  // Every key of it in the index's slot (one node serves a snapshot's whole restore).
  EXPECT_EQ(key_slot(snapshot_index_key(s.key)), key_slot(manifest_key(s.key)));
  EXPECT_EQ(key_slot(snapshot_index_key(s.key)), key_slot(chunk_key(s.key, 4)));
  // An anchor nobody wrote: NotFound.
  EXPECT_EQ(index_of(make_snapshot(2, 3, 40)).status, Status::NotFound);
}

TEST_F(SnapshotIndex, AFieldTheStoreLostComesBackWithTheNextWriter) {
  const TestSnapshot s = make_snapshot(3, 0, 12);
  ASSERT_EQ(store_->put(s.key, s.header(), s.view()), Status::Ok);
  redis_.cli({"DEL", snapshot_index_key(s.key)});  // evicted
  EXPECT_EQ(index_of(s).status, Status::NotFound);
  EXPECT_EQ(store_->put(s.key, s.header(), s.view()), Status::AlreadyPresent);
  EXPECT_EQ(index_of(s).status, Status::Ok);
}

TEST_F(SnapshotIndex, AFieldWhoseManifestIsGoneIsClearedWhenAsked) {
  const TestSnapshot s = make_snapshot(4, 2, 5);
  const TestSnapshot kept = make_snapshot(4, 2, 6);
  ASSERT_EQ(store_->put(s.key, s.header(), s.view()), Status::Ok);
  ASSERT_EQ(store_->put(kept.key, kept.header(), kept.view()), Status::Ok);
  redis_.cli({"DEL", manifest_key(s.key)});  // evicted by the store
  EXPECT_EQ(index_length(s), "2\n");
  std::vector<ProbeResult> found;
  store_->probe({&s.key, 1}, found);
  EXPECT_EQ(found[0].status, Status::NotFound);
  EXPECT_EQ(index_length(s), "1\n");
  const IndexResult r = index_of(s);
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0].key, kept.key);
}

TEST_F(SnapshotIndex, ADamagedSnapshotLeavesTheIndexWithIt) {
  const TestSnapshot s = make_snapshot(5, 1, 3);
  ASSERT_EQ(store_->put(s.key, s.header(), s.view()), Status::Ok);
  redis_.cli({"SETRANGE", chunk_key(s.key, 1), "10", "kvpark-was-here"});
  std::vector<ProbeResult> found;
  store_->probe({&s.key, 1}, found);
  ASSERT_EQ(found[0].status, Status::Ok);
  std::vector<int32_t> tail(s.tail.size());
  std::vector<uint8_t> payload(s.payload.size());
  const ImageTarget target{.tokens = reinterpret_cast<uint8_t*>(tail.data()),
                           .tokens_bytes = tail.size() * sizeof(int32_t),
                           .payload = payload.data(),
                           .payload_bytes = payload.size()};
  EXPECT_EQ(store_->get(s.key, found[0].manifest, target), Status::Corrupt);
  EXPECT_EQ(redis_.cli({"DBSIZE"}), "0\n");  // manifest, chunks and the index's only field
}

TEST_F(SnapshotIndex, AFieldThatDoesNotDecodeIsNeverOfferedAndIsCleared) {
  const TestSnapshot s = make_snapshot(6, 4, 9);
  ASSERT_EQ(store_->put(s.key, s.header(), s.view()), Status::Ok);
  const std::string index = snapshot_index_key(s.key);
  redis_.cli({"HSET", index, "not-a-field", "x"});
  // A field of the right shape whose value is not the tail its digest names.
  TestSnapshot liar = make_snapshot(6, 4, 10);
  EntryKey lying = liar.key;
  std::string field = index_field(lying);
  for (char& ch : field) ch = ch == '\0' ? '\x01' : ch;  // redis-cli args cannot hold NUL
  redis_.cli({"HSET", index, field, "abcd"});
  EXPECT_EQ(index_length(s), "3\n");
  const IndexResult r = index_of(s);
  ASSERT_EQ(r.status, Status::Ok);
  ASSERT_EQ(r.members.size(), 1u);
  EXPECT_EQ(r.members[0].key, s.key);
  EXPECT_EQ(store_->counters().corrupt_values, 2u);
  EXPECT_EQ(index_length(s), "1\n");
  // Something else under the index's key (another program's value): deleted.
  redis_.cli({"SET", index, "foreign"});
  EXPECT_EQ(index_of(s).status, Status::Corrupt);
  EXPECT_EQ(redis_.cli({"EXISTS", index}), "0\n");
}

TEST_F(SnapshotIndex, ASnapshotTheStoreRefusesMidwayIsNeitherManifestedNorListed) {
  const TestSnapshot s = make_snapshot(7, 2, 20, 64 * test_chunk_bytes);
  // Room for a few chunks, not all of them.
  const std::string info = redis_.cli({"INFO", "memory"});
  const uint64_t used = std::stoull(info.substr(info.find("used_memory:") + 12));
  redis_.cli({"CONFIG", "SET", "maxmemory-policy", "noeviction"});
  redis_.cli({"CONFIG", "SET", "maxmemory", std::to_string(used + 32 * test_chunk_bytes)});
  EXPECT_EQ(store_->put(s.key, s.header(), s.view()), Status::IoError);
  EXPECT_GE(store_->counters().writes_refused, 1u);
  EXPECT_NE(redis_.cli({"EXISTS", chunk_key(s.key, 0)}), "0\n");        // some chunks landed...
  EXPECT_EQ(redis_.cli({"EXISTS", manifest_key(s.key)}), "0\n");        // ...no manifest...
  EXPECT_EQ(redis_.cli({"EXISTS", snapshot_index_key(s.key)}), "0\n");  // ...and no field
}

TEST_F(SnapshotIndex, APutWhoseTokensAreNotItsKeysTailIsRefused) {
  TestSnapshot s = make_snapshot(8, 1, 4);
  s.tail[2] ^= 1;  // the image's tail is no longer the one the key's digest names
  EXPECT_EQ(store_->put(s.key, s.header(), s.view()), Status::Corrupt);
  EXPECT_EQ(redis_.cli({"DBSIZE"}), "0\n");
}

}  // namespace
}  // namespace kvpark::remote
