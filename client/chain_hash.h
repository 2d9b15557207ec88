// Chain hashing of token ids (DESIGN.md §2): h[i] = XXH3-128(h[i-1] || tokens of chunk i).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/types.h"

namespace kvpark::client {

// Writes ret_hashes.size() chain hashes over consecutive chunks of chunk_tokens tokens,
// continuing from `previous` (the namespace seed for chunk 0).
// tokens.size() must be at least ret_hashes.size() * chunk_tokens.
void chain_hashes(const Hash128& previous, std::span<const int32_t> tokens, uint32_t chunk_tokens,
                  std::span<Hash128> ret_hashes);

}  // namespace kvpark::client
