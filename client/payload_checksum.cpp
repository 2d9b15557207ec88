// Fused copy and XXH3-64 (see payload_checksum.h).
#include "client/payload_checksum.h"

#include <algorithm>
#include <cstring>

#include "proto/limits.h"
#include "proto/xxh3.h"

namespace kvpark::client {
namespace {

template <bool hash_destination>
uint64_t copy_checksum(void* dst, const void* src, size_t count) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(limits::checksum_piece_bytes, count - done);
    std::memcpy(d + done, s + done, n);
    XXH3_64bits_update(&state, hash_destination ? d + done : s + done, n);
    done += n;
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

uint64_t payload_checksum(const void* bytes, size_t count) { return XXH3_64bits(bytes, count); }

uint64_t copy_checksum_destination(void* dst, const void* src, size_t count) {
  return copy_checksum<true>(dst, src, count);
}

uint64_t copy_checksum_source(void* dst, const void* src, size_t count) {
  return copy_checksum<false>(dst, src, count);
}

struct StreamingChecksum::State {
  XXH3_state_t xxh;
};

StreamingChecksum::StreamingChecksum() : state_(std::make_unique<State>()) {
  XXH3_64bits_reset(&state_->xxh);
}
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::copy(void* dst, const void* src, size_t count) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t done = 0; done < count;) {
    const size_t n = std::min(limits::checksum_piece_bytes, count - done);
    std::memcpy(d + done, s + done, n);
    XXH3_64bits_update(&state_->xxh, s + done, n);
    done += n;
  }
  bytes_ += count;
}

uint64_t StreamingChecksum::digest() const { return XXH3_64bits_digest(&state_->xxh); }

}  // namespace kvpark::client
