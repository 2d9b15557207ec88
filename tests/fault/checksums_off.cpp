// The mutation check of payload verification: libkvpark built with this file in
// place of client/payload_checksum.cpp checksums every payload as 0, so writers seal
// 0, readers compute 0 and every comparison passes: verification is switched off.
// The hostile-client corruption test linked against it must fail by handing wrong
// bytes to the victim (tests/fault/mutation_check.sh); if it passed, that test
// could not tell verification from its absence.
#include <cstring>

#include "client/payload_checksum.h"

namespace kvpark::client {

uint64_t payload_checksum(const void*, size_t) { return 0; }

uint64_t copy_checksum(void* dst, const void* src, size_t count) {
  std::memcpy(dst, src, count);
  return 0;
}

struct StreamingChecksum::State {
  uint64_t bytes = 0;
};
StreamingChecksum::StreamingChecksum(CopyStores) : state_(std::make_unique<State>()) {}
StreamingChecksum::~StreamingChecksum() = default;
void StreamingChecksum::copy(void* dst, const void* src, size_t count) {
  std::memcpy(dst, src, count);
  state_->bytes += count;
}
uint64_t StreamingChecksum::bytes() const {
  return state_->bytes;
}
uint64_t StreamingChecksum::digest() const { return 0; }

}  // namespace kvpark::client
