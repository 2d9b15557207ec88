// Chain hashing (DESIGN.md §2): h[i] = XXH3-128(h[i-1] || tokens of chunk i).
// Known answers pin the format: every parked entry is addressed by these values,
// so a change here silently turns every cache into misses.
#include "client/chain_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "client/kvpark.h"

namespace kvpark::client {
namespace {

std::vector<int32_t> iota_tokens(size_t n, int32_t first = 0) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// The definition, written out independently of the implementation.
Hash128 reference_link(const Hash128& previous, std::span<const int32_t> chunk) {
  std::vector<uint8_t> bytes(16 + chunk.size() * 4);
  std::memcpy(bytes.data(), &previous.low, 8);
  std::memcpy(bytes.data() + 8, &previous.high, 8);
  for (size_t i = 0; i < chunk.size(); ++i) {
    const uint32_t v = static_cast<uint32_t>(chunk[i]);
    for (int b = 0; b < 4; ++b) bytes[16 + i * 4 + b] = static_cast<uint8_t>(v >> (8 * b));
  }
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.low64, h.high64};
}

TEST(ChainHash, MatchesTheDefinition) {
  const Hash128 seed{0x0123456789abcdefull, 0xfedcba9876543210ull};
  const auto tokens = iota_tokens(4 * 16, -5);
  std::vector<Hash128> got(4);
  chain_hashes(seed, tokens, 16, got);
  Hash128 h = seed;
  for (size_t i = 0; i < 4; ++i) {
    h = reference_link(h, std::span(tokens).subspan(i * 16, 16));
    EXPECT_EQ(got[i], h) << "chunk " << i;
  }
}

TEST(ChainHash, KnownAnswersAreStable) {
  const auto tokens = iota_tokens(3 * 4);
  std::vector<Hash128> got(3);
  chain_hashes({1, 0}, tokens, 4, got);
  // Recorded from XXH3-128 of libxxhash 0.8; they must never change.
  const Hash128 expected[3] = {
      Hash128{0x7ee72017defd7f2aull, 0xd71b07203d4f61f6ull},
      Hash128{0xd74f8d8ad62c3bdbull, 0xbe9d400f900f6fb9ull},
      Hash128{0x97056c24a996d2acull, 0xdfedf394065c0402ull},
  };
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i].low, expected[i].low) << "chunk " << i;
    EXPECT_EQ(got[i].high, expected[i].high) << "chunk " << i;
  }
}

TEST(ChainHash, DependsOnTheSeed) {
  const auto tokens = iota_tokens(64);
  std::vector<Hash128> a(4), b(4), c(4);
  chain_hashes({1, 0}, tokens, 16, a);
  chain_hashes({2, 0}, tokens, 16, b);
  chain_hashes({1, 1}, tokens, 16, c);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NE(a[i], b[i]) << "namespaces never share entries";
    EXPECT_NE(a[i], c[i]) << "the seed's high half counts too";
  }
}

TEST(ChainHash, DependsOnEveryEarlierChunk) {
  auto tokens = iota_tokens(64);
  std::vector<Hash128> a(4), b(4);
  chain_hashes({1, 0}, tokens, 16, a);
  tokens[3] += 1;  // a token of chunk 0
  chain_hashes({1, 0}, tokens, 16, b);
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(a[i], b[i]) << "chunk " << i;
  tokens[3] -= 1;
  tokens[40] += 1;  // a token of chunk 2
  chain_hashes({1, 0}, tokens, 16, b);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  EXPECT_NE(a[3], b[3]);
}

TEST(ChainHash, ContinuesFromAnyLink) {
  const auto tokens = iota_tokens(5 * 8, 100);
  std::vector<Hash128> all(5), tail(3);
  chain_hashes({9, 9}, tokens, 8, all);
  chain_hashes(all[1], std::span(tokens).subspan(16), 8, tail);
  EXPECT_EQ(tail[0], all[2]);
  EXPECT_EQ(tail[2], all[4]);
}

TEST(ChainHash, ChunkSizeChangesTheHashes) {
  const auto tokens = iota_tokens(64);
  std::vector<Hash128> a(1), b(2);
  chain_hashes({1, 0}, tokens, 32, a);
  chain_hashes({1, 0}, tokens, 16, b);
  EXPECT_NE(a[0], b[1]);
}

TEST(ChainHash, CApiMatchesCppApi) {
  const auto tokens = iota_tokens(3 * 16, 7);
  std::vector<Hash128> cpp(3);
  chain_hashes({5, 6}, tokens, 16, cpp);
  kvpark_hash128 c[3];
  kvpark_chain_hashes({5, 6}, tokens.data(), 16, 3, c);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].low, cpp[i].low);
    EXPECT_EQ(c[i].high, cpp[i].high);
  }
}

}  // namespace
}  // namespace kvpark::client
