// Payload checksums: XXH3-64 of an entry's whole payload.
//
// The writer computes it while it copies the payload into the arena and hands it
// to the daemon at SEAL; the daemon keeps it where no client can write and returns
// it in LOOKUP replies; the reader verifies while it copies out. Copy and hash are
// one pass (client/copy_xxh3.h): the checksum is of exactly the bytes written, so
// what a restore verified is what the engine received, and a publish seals what it
// wrote, whatever another process does to the arena meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "client/copy_xxh3.h"  // CopyStores

namespace kvpark::client {

uint64_t payload_checksum(const void* bytes, size_t count);

// Copies src to dst and returns the checksum of the bytes written.
uint64_t copy_checksum(void* dst, const void* src, size_t count);

// A checksum built from consecutive pieces (a snapshot written in parts).
class StreamingChecksum {
 public:
  explicit StreamingChecksum(CopyStores stores = CopyStores::by_size);
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  // Copies `count` bytes of src to dst and appends them to the checksum.
  void copy(void* dst, const void* src, size_t count);
  uint64_t bytes() const;
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kvpark::client
