// Deterministic test content: token sequences and payload bytes that any process
// can regenerate, so a restorer verifies every byte without talking to the publisher.
// A block's payload is a function of its chain hash, so identical prefixes published
// by different processes carry identical bytes (as real KV would).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "client/kvpark.h"

namespace kvpark::testing {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// `count` token ids in [0, 50000) drawn from `seed`.
inline std::vector<int32_t> make_tokens(uint64_t seed, size_t count) {
  std::vector<int32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = static_cast<int32_t>(mix64(seed * 1315423911u + i) % 50000);
  return tokens;
}

// Fills `bytes` from a 64-bit stream keyed by `key`.
inline void fill_payload(uint64_t key, void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  uint64_t state = mix64(key | 1);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    state = mix64(state + 0x9e3779b97f4a7c15ull);
    std::memcpy(p + i, &state, 8);
  }
  state = mix64(state + 0x9e3779b97f4a7c15ull);
  std::memcpy(p + i, &state, bytes - i);
}

// True when `data` holds exactly what fill_payload(key, ..., bytes) writes (the
// same stream, compared as it is generated: no copy, for benchmarks too).
inline bool payload_matches(uint64_t key, const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t state = mix64(key | 1);
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    state = mix64(state + 0x9e3779b97f4a7c15ull);
    if (std::memcmp(p + i, &state, 8) != 0) return false;
  }
  state = mix64(state + 0x9e3779b97f4a7c15ull);
  return std::memcmp(p + i, &state, bytes - i) == 0;
}

inline uint64_t payload_key(const kvpark_hash128& h) { return h.low ^ mix64(h.high); }

}  // namespace kvpark::testing
