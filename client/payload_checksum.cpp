// Payload checksums (see payload_checksum.h).
#include "client/payload_checksum.h"

#include "client/copy_xxh3.h"
#include "proto/xxh3.h"

namespace kvpark::client {

uint64_t payload_checksum(const void* bytes, size_t count) { return XXH3_64bits(bytes, count); }

uint64_t copy_checksum(void* dst, const void* src, size_t count) {
  CopyXxh3 stream;
  stream.copy(dst, src, count);
  return stream.digest();
}

struct StreamingChecksum::State {
  explicit State(CopyStores stores) : stream(stores) {}
  CopyXxh3 stream;
};

StreamingChecksum::StreamingChecksum(CopyStores stores)
    : state_(std::make_unique<State>(stores)) {}
StreamingChecksum::~StreamingChecksum() = default;

void StreamingChecksum::copy(void* dst, const void* src, size_t count) {
  state_->stream.copy(dst, src, count);
}

uint64_t StreamingChecksum::bytes() const {
  return state_->stream.bytes();
}
uint64_t StreamingChecksum::digest() const {
  return state_->stream.digest();
}

}  // namespace kvpark::client
