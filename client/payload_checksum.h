// Payload checksums: XXH3-64 of an entry's whole payload.
//
// The writer computes it while it copies the payload into the arena and hands it
// to the daemon at SEAL; the daemon keeps it where no client can write and returns
// it in LOOKUP replies; the reader verifies while it copies out. Copy and hash are
// fused: each piece (limits::checksum_piece_bytes) is hashed right after it is
// copied, while it is still in cache, so verification costs no second pass over
// memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvpark::client {

uint64_t payload_checksum(const void* bytes, size_t count);

// Copies src to dst and returns the checksum of the bytes now in dst (restores:
// what the engine received is what was checked).
uint64_t copy_checksum_destination(void* dst, const void* src, size_t count);
// Copies src to dst and returns the checksum of src (publishes: what the engine
// meant to write, whatever another process does to the shared copy meanwhile).
uint64_t copy_checksum_source(void* dst, const void* src, size_t count);

// A checksum built from consecutive pieces (a snapshot written in parts).
class StreamingChecksum {
 public:
  StreamingChecksum();
  ~StreamingChecksum();
  StreamingChecksum(const StreamingChecksum&) = delete;
  StreamingChecksum& operator=(const StreamingChecksum&) = delete;
  // Copies `count` bytes of src to dst and folds src into the checksum.
  void copy(void* dst, const void* src, size_t count);
  uint64_t bytes() const { return bytes_; }
  uint64_t digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
  uint64_t bytes_ = 0;
};

}  // namespace kvpark::client
