// The fused copy and XXH3-64 (client/copy_xxh3.h) against xxHash's own XXH3_64bits:
// every kernel this CPU runs, at every length where XXH3 changes path (240 bytes,
// stripes, 1 KiB blocks, the streaming-store threshold), from sources and into
// destinations at every alignment, whole and in any split into pieces.
#include "client/copy_xxh3.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "proto/limits.h"

namespace kvpark::client {
namespace {

std::vector<CopyKernel> supported_kernels() {
  std::vector<CopyKernel> kernels;
  for (CopyKernel k : {CopyKernel::portable, CopyKernel::avx2, CopyKernel::avx512}) {
    if (copy_kernel_supported(k)) kernels.push_back(k);
  }
  return kernels;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

// A buffer whose data starts `offset` bytes past a 64-byte boundary.
struct Placed {
  std::vector<uint8_t> storage;
  uint8_t* data;
  Placed(size_t bytes, size_t offset) : storage(bytes + 128) {
    auto base = reinterpret_cast<uintptr_t>(storage.data());
    data = reinterpret_cast<uint8_t*>((base + 63) / 64 * 64 + offset);
  }
};

std::vector<size_t> edge_lengths() {
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (size_t base : {size_t{2048}, size_t{4096}, size_t{16384}, limits::streaming_copy_min_bytes,
                      size_t{1} << 20}) {
    for (size_t n : {base - 65, base - 64, base - 1, base, base + 1, base + 63, base + 64}) {
      lengths.push_back(n);
    }
  }
  lengths.push_back((size_t{3} << 20) + 12345);
  return lengths;
}

TEST(CopyXxh3, EveryKernelMatchesXxh3AtEveryLengthEdge) {
  const auto source = random_bytes((size_t{4} << 20) + 256, 1);
  for (CopyKernel kernel : supported_kernels()) {
    SCOPED_TRACE(copy_kernel_name(kernel));
    for (size_t n : edge_lengths()) {
      const size_t src_offset = n % 64;
      // From 64 KiB on, by_size stores around the cache: straight from the stripe
      // into an aligned destination, through an L1 piece into the others.
      for (CopyStores stores : {CopyStores::by_size, CopyStores::cached}) {
        for (size_t dst_offset : {size_t{0}, size_t{1}, size_t{32}}) {
          Placed dst(n, dst_offset);
          std::memset(dst.data, 0xee, n);
          CopyXxh3 stream(stores, kernel);
          stream.copy(dst.data, source.data() + src_offset, n);
          ASSERT_EQ(stream.digest(), XXH3_64bits(source.data() + src_offset, n))
              << n << " bytes, destination +" << dst_offset;
          ASSERT_EQ(std::memcmp(dst.data, source.data() + src_offset, n), 0) << n << " bytes";
          ASSERT_EQ(stream.bytes(), n);
        }
      }
    }
  }
}

TEST(CopyXxh3, AnySplitIntoPiecesHashesAsOneCopy) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto source = random_bytes(size_t{1} << 20, seed);
  for (CopyKernel kernel : supported_kernels()) {
    SCOPED_TRACE(copy_kernel_name(kernel));
    for (int round = 0; round < 200; ++round) {
      const size_t n = rng() % (round < 150 ? 5000 : source.size());
      Placed dst(n, 0);
      CopyXxh3 stream(round % 2 == 0 ? CopyStores::by_size : CopyStores::cached, kernel);
      for (size_t done = 0; done < n;) {
        // Mostly small pieces, now and then one past the streaming threshold.
        const size_t most = rng() % 8 == 0 ? n - done : std::min<size_t>(n - done, 300);
        const size_t piece = rng() % (most + 1);
        stream.copy(dst.data + done, source.data() + done, piece);
        done += piece;
        // A digest mid-stream changes nothing that follows.
        if (rng() % 4 == 0) {
          ASSERT_EQ(stream.digest(), XXH3_64bits(source.data(), done));
        }
      }
      ASSERT_EQ(stream.digest(), XXH3_64bits(source.data(), n)) << n << " bytes";
      ASSERT_EQ(std::memcmp(dst.data, source.data(), n), 0);
    }
  }
}

// What is verified is what was written: another process rewriting the source while
// it is copied (a hostile client flipping bytes of a sealed payload) can change
// what is copied, but never make the checksum disagree with the copy.
TEST(CopyXxh3, TheChecksumIsOfTheBytesWrittenWhileTheSourceChanges) {
  const size_t n = 256 * 1024;
  auto source = random_bytes(n, 2);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> flips{0};
  std::thread flipper([&] {
    std::mt19937_64 rng(3);
    while (!stop.load(std::memory_order_relaxed)) {
      std::atomic_ref<uint8_t>(source[rng() % n]).fetch_xor(0x5a, std::memory_order_relaxed);
      flips.fetch_add(1, std::memory_order_relaxed);
    }
  });
  while (flips.load() == 0) std::this_thread::yield();  // the writer is running
  Placed dst(n, 0);
  std::vector<std::string> disagreements;
  for (CopyKernel kernel : supported_kernels()) {
    for (int i = 0; i < 100; ++i) {
      CopyXxh3 stream(i % 2 == 0 ? CopyStores::by_size : CopyStores::cached, kernel);
      stream.copy(dst.data, source.data(), n / 3);
      stream.copy(dst.data + n / 3, source.data() + n / 3, n - n / 3);
      if (stream.digest() != XXH3_64bits(dst.data, n)) {
        disagreements.push_back(copy_kernel_name(kernel));
      }
    }
  }
  stop = true;
  flipper.join();
  EXPECT_TRUE(disagreements.empty())
      << disagreements.size() << " copies, the first by " << disagreements.front();
}

}  // namespace
}  // namespace kvpark::client
