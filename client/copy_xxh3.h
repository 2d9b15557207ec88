// Copy and XXH3-64 in one pass over memory.
//
// Every 64-byte stripe is loaded once, stored to the destination and folded into
// the hash from the same register, so the checksum is of exactly the bytes written,
// whatever another process does to the source meanwhile: a restore can never hand an
// engine bytes other than the ones it verified, and a publish seals the bytes it
// wrote. Large copies store around the cache (non-temporal stores, as memcpy does
// for large copies): a cached store first reads the destination line from memory,
// which made copy-then-hash run at half of memcpy's speed (kvpark-bench).
//
// The values are XXH3-64 with the default secret and seed, the same as
// XXH3_64bits() over the whole input however it was split into copy() calls
// (tests/unit/copy_xxh3_test.cpp checks every kernel against it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvpark::client {

// avx512 and avx2 fold each stripe in from the register they store; `portable` (any
// other CPU) copies each piece into a small private buffer, hashes it there with
// xxHash's own code (SSE2, NEON) and stores it from there: as exact, a little slower.
enum class CopyKernel : uint8_t { portable, avx2, avx512 };

// The fastest kernel this CPU (and its operating system) runs.
CopyKernel best_copy_kernel();
bool copy_kernel_supported(CopyKernel kernel);
const char* copy_kernel_name(CopyKernel kernel);

// How copies store. by_size: around the cache from limits::streaming_copy_min_bytes
// on (a destination that large is not read again soon, and a cached store would
// first read each line from memory); cached: always through the cache, for a
// destination the caller reads at once and reuses (a staging buffer in L2).
enum class CopyStores : uint8_t { by_size, cached };

class CopyXxh3 {
 public:
  static constexpr size_t stripe_bytes = 64;
  static constexpr size_t buffer_bytes = 4 * stripe_bytes;

  explicit CopyXxh3(CopyStores stores = CopyStores::by_size,
                    CopyKernel kernel = best_copy_kernel());
  ~CopyXxh3();
  CopyXxh3(const CopyXxh3&) = delete;
  CopyXxh3& operator=(const CopyXxh3&) = delete;

  // Copies `count` bytes of src to dst (they must not overlap) and appends them to
  // the hashed stream.
  void copy(void* dst, const void* src, size_t count);
  uint64_t bytes() const { return total_bytes_; }
  // XXH3-64 of every byte copied so far; copying may go on after it.
  uint64_t digest() const;

  // The hash state between calls: XXH3's eight accumulators, the stripe position in
  // the current block, and the last stripe folded in (the final stripe overlaps it).
  struct Accumulator {
    alignas(64) uint64_t lanes[8];
    size_t stripes_in_block = 0;
    uint8_t last_stripe[stripe_bytes] = {};
  };

 private:
  struct Portable;  // xxHash's streaming state, for the portable kernel

  CopyKernel kernel_;
  bool streaming_ = true;  // large copies may store around the cache (CopyStores::by_size)
  std::unique_ptr<Portable> portable_;
  Accumulator accumulator_;
  // The stream's tail, not yet folded in: XXH3 treats its last stripe (and any input
  // of 240 bytes or fewer) differently, so the last bytes wait for digest(). Bytes
  // pass through here on their way to dst, so they too are hashed as written.
  uint8_t buffer_[buffer_bytes];
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace kvpark::client
