// Deterministic state content: what a strict serial reference engine would hold
// after a token prefix. A block's payload is a function of its chain hash (the
// namespace seed and every token up to the block's end); a snapshot's payload is a
// function of the namespace and a hash of every token before its position. So the
// same prefix published by any process carries the same bytes, and any restorer
// can check every byte without asking who published it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "client/kvpark.h"

namespace kvpark::replay {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Rolling prefix key: prefix_keys[p] identifies tokens[0, p) in namespace `ns_low`.
inline std::vector<uint64_t> prefix_keys(uint64_t ns_low, const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> keys(tokens.size() + 1);
  keys[0] = mix64(ns_low ^ 0x736e617073686f74ull);
  for (size_t i = 0; i < tokens.size(); ++i) {
    keys[i + 1] = mix64(keys[i] + static_cast<uint32_t>(tokens[i]) + 0x9e3779b97f4a7c15ull);
  }
  return keys;
}

inline uint64_t block_key(const kvpark_hash128& chain_hash) {
  return chain_hash.low ^ mix64(chain_hash.high);
}

// Fills `bytes` from a stream keyed by `key`.
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

// True when data holds exactly what fill_payload(key, ..., bytes) writes.
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

}  // namespace kvpark::replay
