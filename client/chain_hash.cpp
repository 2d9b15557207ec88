// XXH3-128 chain hashing (see chain_hash.h).
#include "client/chain_hash.h"

#include <xxhash.h>

#include <cassert>
#include <cstring>
#include <vector>

namespace kvpark::client {

void chain_hashes(const Hash128& previous, std::span<const int32_t> tokens, uint32_t chunk_tokens,
                  std::span<Hash128> ret_hashes) {
  assert(chunk_tokens > 0 && tokens.size() >= ret_hashes.size() * chunk_tokens);
  // One buffer: [previous hash: low, high][chunk tokens, int32 little-endian].
  const size_t chunk_bytes = size_t{chunk_tokens} * sizeof(int32_t);
  thread_local std::vector<uint8_t> buffer;
  buffer.resize(sizeof(Hash128) + chunk_bytes);
  Hash128 h = previous;
  for (size_t i = 0; i < ret_hashes.size(); ++i) {
    std::memcpy(buffer.data(), &h.low, 8);
    std::memcpy(buffer.data() + 8, &h.high, 8);
    std::memcpy(buffer.data() + 16, tokens.data() + i * chunk_tokens, chunk_bytes);
    const XXH128_hash_t x = XXH3_128bits(buffer.data(), buffer.size());
    h = Hash128{x.low64, x.high64};
    ret_hashes[i] = h;
  }
}

}  // namespace kvpark::client
