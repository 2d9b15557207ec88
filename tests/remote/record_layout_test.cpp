// The remote tier's pure parts: hash slots, keys, manifests, chunking limits.
#include <gtest/gtest.h>

#include <vector>

#include "client/chain_hash.h"
#include "remote/cluster_client.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "remote/slot.h"

namespace kvpark::remote {
namespace {

EntryKey block_key(uint64_t n) {
  return EntryKey{.ns = {0x1111, 0x2222}, .key_hash = {n, ~n}};
}

Manifest manifest_for(const EntryKey& key, uint32_t tokens, uint64_t payload, uint32_t chunk) {
  Manifest m;
  m.header = manifest_header_for(key);
  m.header.token_count = tokens;
  m.header.payload_bytes = payload;
  m.header.chunk_bytes = chunk;
  m.header.chunk_count = chunk_count_for(m.image_bytes(), chunk);
  m.chunk_checksums.assign(m.header.chunk_count, 7);
  return m;
}

TEST(HashSlot, MatchesRedisCluster) {
  EXPECT_EQ(crc16_xmodem("123456789"), 0x31c3);  // the CRC16-XMODEM check value
  EXPECT_EQ(key_slot("foo"), 12182);             // as CLUSTER KEYSLOT foo answers
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(key_slot("a{}b"), crc16_xmodem("a{}b") % hash_slots);  // an empty tag hashes all
}

TEST(RecordLayout, KeysOfOneEntryShareASlotAndChainsSpread) {
  const EntryKey k = block_key(42);
  EXPECT_EQ(key_slot(manifest_key(k)), key_slot(chunk_key(k, 0)));
  EXPECT_EQ(key_slot(manifest_key(k)), key_slot(chunk_key(k, 17)));
  std::vector<int> per_third(3, 0);
  for (uint64_t i = 0; i < 300; ++i) ++per_third[key_slot(manifest_key(block_key(i * 7919))) * 3 / hash_slots];
  for (int n : per_third) EXPECT_GT(n, 50);
  EntryKey s = k;
  s.snapshot = true;
  s.position = 100;
  EXPECT_NE(manifest_key(s), manifest_key(k));
  EXPECT_EQ(key_slot(manifest_key(s)), key_slot(manifest_key(k)));  // beside its anchor
  EXPECT_NE(manifest_key(k).find("kvpark:r1:"), std::string::npos);
}

TEST(RecordLayout, ManifestRoundTrips) {
  const EntryKey k = block_key(1);
  Manifest m = manifest_for(k, 64, 100'000, chunk_bytes_min);
  m.header.payload_checksum = 0xabcdef;
  m.header.parent_hash = {3, 4};
  const std::string v = encode_manifest(m);
  Manifest back;
  ASSERT_EQ(decode_manifest(v, back), Status::Ok);
  EXPECT_EQ(back.header.payload_checksum, 0xabcdefu);
  EXPECT_EQ(back.header.parent_hash, (Hash128{3, 4}));
  EXPECT_EQ(back.chunk_checksums, m.chunk_checksums);
  EXPECT_TRUE(manifest_names(back, k));
  EXPECT_FALSE(manifest_names(back, block_key(2)));
}

TEST(RecordLayout, RejectsDamagedTruncatedAndForeignManifests) {
  const Manifest m = manifest_for(block_key(1), 64, 10'000, chunk_bytes_min);
  std::string v = encode_manifest(m);
  Manifest back;
  EXPECT_EQ(decode_manifest(v.substr(0, v.size() - 1), back), Status::Corrupt);
  EXPECT_EQ(decode_manifest("", back), Status::Corrupt);
  std::string flipped = v;
  flipped[20] ^= 1;
  EXPECT_EQ(decode_manifest(flipped, back), Status::Corrupt);
  Manifest other = m;
  other.header.format_version = record_format_version + 1;
  EXPECT_EQ(decode_manifest(encode_manifest(other), back), Status::Corrupt);
  Manifest lying = m;
  lying.header.payload_bytes += chunk_bytes_min;  // sizes disagree with the chunk count
  EXPECT_EQ(decode_manifest(encode_manifest(lying), back), Status::Corrupt);
}

TEST(RecordLayout, ChunkSizeIsCappedAtTheLimit) {
  const EntryKey k = block_key(1);
  Manifest at = manifest_for(k, 0, uint64_t{chunk_bytes_max} * 2, chunk_bytes_max);
  Manifest back;
  EXPECT_EQ(decode_manifest(encode_manifest(at), back), Status::Ok);
  Manifest past = manifest_for(k, 0, uint64_t{chunk_bytes_max + 1} * 2, chunk_bytes_max + 1);
  EXPECT_EQ(decode_manifest(encode_manifest(past), back), Status::Corrupt);
}

TEST(RecordLayout, ChunkCountIsCappedAtTheLimit) {
  const EntryKey k = block_key(1);
  Manifest at = manifest_for(k, 0, uint64_t{chunks_per_entry_max} * chunk_bytes_min, chunk_bytes_min);
  ASSERT_EQ(at.header.chunk_count, chunks_per_entry_max);
  Manifest back;
  EXPECT_EQ(decode_manifest(encode_manifest(at), back), Status::Ok);
  Manifest past =
      manifest_for(k, 0, uint64_t{chunks_per_entry_max + 1} * chunk_bytes_min, chunk_bytes_min);
  ASSERT_EQ(past.header.chunk_count, chunks_per_entry_max + 1);
  EXPECT_EQ(decode_manifest(encode_manifest(past), back), Status::Corrupt);
}

TEST(RecordLayout, ChainHashIsTheClientsChainHash) {
  std::vector<int32_t> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 31 + 5);
  const Hash128 seed{9, 10};
  Hash128 expected;
  client::chain_hashes(seed, tokens, 64, {&expected, 1});
  EXPECT_EQ(block_chain_hash(seed, tokens), expected);
}

TEST(RecordLayout, ImageRangesSplitAtThePayload) {
  uint8_t tokens[8];
  uint8_t payload[8];
  std::vector<std::pair<const uint8_t*, uint64_t>> runs;
  for_image_range(tokens, 8, payload, 6, 4,
                  [&](const uint8_t* p, uint64_t n) { runs.emplace_back(p, n); });
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].first, tokens + 6);
  EXPECT_EQ(runs[0].second, 2u);
  EXPECT_EQ(runs[1].first, payload + 0);
  EXPECT_EQ(runs[1].second, 2u);
}

TEST(RecordLayout, ASnapshotsIndexFieldNamesItAndItsValueIsItsTail) {
  std::vector<int32_t> tail = {5, 6, 7};
  EntryKey s = block_key(3);
  s.snapshot = true;
  s.position = 2 * 64 + 3;
  s.tail_digest = tail_digest_of(tail);
  // The index lives with the anchor's snapshots, apart from their manifests.
  EXPECT_EQ(key_slot(snapshot_index_key(s)), key_slot(manifest_key(s)));
  EXPECT_NE(snapshot_index_key(s), manifest_key(s));
  EXPECT_NE(snapshot_index_key(s), manifest_key(block_key(3)));
  const std::string field = index_field(s);
  EXPECT_EQ(field.size(), index_field_bytes);
  EntryKey back{.ns = s.ns, .key_hash = s.key_hash};
  ASSERT_TRUE(decode_index_field(field, back));
  EXPECT_EQ(back, s);
  EXPECT_FALSE(decode_index_field(field.substr(1), back));
  EXPECT_FALSE(decode_index_field(std::string(index_field_bytes, '\0'), back));  // position 0
  std::vector<int32_t> got;
  ASSERT_TRUE(decode_index_value(index_value(tail), s, got));
  EXPECT_EQ(got, tail);
  std::vector<int32_t> other = {5, 6, 8};
  EXPECT_FALSE(decode_index_value(index_value(other), s, got));  // not the digest's tail
  EXPECT_FALSE(decode_index_value(index_value(tail).substr(1), s, got));
  // At the cap and past it.
  std::vector<int32_t> at_cap(index_tail_tokens_max, 1);
  std::vector<int32_t> past_cap(index_tail_tokens_max + 1, 1);
  EntryKey long_tail = s;
  long_tail.position = 10 * index_tail_tokens_max;
  long_tail.tail_digest = tail_digest_of(at_cap);
  EXPECT_TRUE(decode_index_value(index_value(at_cap), long_tail, got));
  long_tail.tail_digest = tail_digest_of(past_cap);
  EXPECT_FALSE(decode_index_value(index_value(past_cap), long_tail, got));
}

TEST(Endpoints, ParsesSeedLists) {
  std::vector<Endpoint> e;
  ASSERT_EQ(parse_endpoints("redis://10.0.0.1:7000,10.0.0.2:7001, 10.0.0.3", e), Status::Ok);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1], (Endpoint{"10.0.0.2", 7001}));
  EXPECT_EQ(e[2].port, 6379);
  ASSERT_EQ(parse_endpoints("[::1]:7000,[fe80::1]", e), Status::Ok);
  EXPECT_EQ(e[0], (Endpoint{"::1", 7000}));
  EXPECT_EQ(e[1], (Endpoint{"fe80::1", 6379}));
  EXPECT_EQ(parse_endpoints("[::1", e), Status::InvalidArgument);
  EXPECT_EQ(parse_endpoints("redis://", e), Status::InvalidArgument);
  EXPECT_EQ(parse_endpoints("host:0", e), Status::InvalidArgument);
  EXPECT_EQ(parse_endpoints("host:65536", e), Status::InvalidArgument);
  std::string at_cap, past_cap;
  for (uint32_t i = 0; i < seeds_max; ++i) at_cap += (i ? ",h:" : "h:") + std::to_string(i + 1);
  past_cap = at_cap + ",h:99";
  EXPECT_EQ(parse_endpoints(at_cap, e), Status::Ok);
  EXPECT_EQ(parse_endpoints(past_cap, e), Status::InvalidArgument);
}

}  // namespace
}  // namespace kvpark::remote
