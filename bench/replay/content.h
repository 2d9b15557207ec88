// Deterministic state content: what a strict serial reference engine would hold
// after a token prefix. A block's payload is a function of its chain hash (the
// namespace seed and every token up to the block's end); a snapshot's payload is a
// function of the namespace and a hash of every token before its position. So the
// same prefix published by any process carries the same bytes, and any restorer
// can check every byte without asking who published it.
#pragma once

#include <cstdint>
#include <vector>

#include "client/kvpark.h"
#include "tests/testing/content.h"

namespace kvpark::replay {

// The payload stream is the tests' (tests/testing/content.h): bytes the replayer
// parks are the bytes the test engines would park for the same prefix.
using testing::fill_payload;
using testing::mix64;
using testing::payload_matches;

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
  return testing::payload_key(chain_hash);
}

}  // namespace kvpark::replay
