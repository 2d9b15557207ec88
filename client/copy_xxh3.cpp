// Fused copy and XXH3-64 (see copy_xxh3.h).
//
// The stripe loop is XXH3's long-input loop (xxhash.h: XXH3_hashLong_internal_loop,
// XXH3_accumulate_512_*, XXH3_scrambleAcc_*) with a store added beside each load.
// Its finishing steps (merging the lanes, inputs of 240 bytes or fewer) are xxHash's
// own, inlined here.
#include "client/copy_xxh3.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>

#include "proto/limits.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#if defined(__x86_64__)
// GCC 12 warns inside its own AVX-512 intrinsics (their _mm512_undefined_* operands).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define KVPARK_X86_KERNELS 1
#endif

namespace kvpark::client {
namespace {

static_assert(std::endian::native == std::endian::little, "XXH3 lanes are read little-endian");

constexpr size_t stripe = CopyXxh3::stripe_bytes;
constexpr size_t secret_bytes = sizeof(XXH3_kSecret);
// XXH3 moves 8 bytes along its secret per stripe and scrambles when the secret runs
// out: 16 stripes (1 KiB) per block with the default 192-byte secret.
constexpr size_t secret_step = 8;
constexpr size_t stripes_per_block = (secret_bytes - stripe) / secret_step;
constexpr size_t scramble_key_offset = secret_bytes - stripe;
constexpr size_t last_stripe_key_offset = secret_bytes - stripe - 7;
constexpr size_t merge_key_offset = 11;
// Reads run this far ahead of the stripe being copied: the hardware prefetcher alone
// left a 1 GiB copy ~10% short of memcpy (kvpark-bench).
constexpr size_t prefetch_distance_bytes = 2048;

enum class Store : uint8_t { cached, streaming };

uint64_t read64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// --- the end of the stream, on every kernel -----------------------------------------

void accumulate_scalar(uint64_t* lanes, const uint8_t* data, const uint8_t* key) {
  for (size_t i = 0; i < 8; ++i) {
    const uint64_t value = read64(data + 8 * i);
    const uint64_t keyed = value ^ read64(key + 8 * i);
    lanes[i ^ 1] += value;
    lanes[i] += (keyed & 0xffffffffu) * (keyed >> 32);
  }
}

void scramble_scalar(uint64_t* lanes, const uint8_t* key) {
  for (size_t i = 0; i < 8; ++i) {
    uint64_t lane = lanes[i];
    lane ^= lane >> 47;
    lane ^= read64(key + 8 * i);
    lanes[i] = lane * XXH_PRIME32_1;
  }
}

// Folds in stripes already copied (the buffered tail at digest()).
void fold_scalar(CopyXxh3::Accumulator& a, const uint8_t* src, size_t stripes) {
  for (size_t s = 0; s < stripes; ++s) {
    accumulate_scalar(a.lanes, src + s * stripe, XXH3_kSecret + a.stripes_in_block * secret_step);
    if (++a.stripes_in_block == stripes_per_block) {
      scramble_scalar(a.lanes, XXH3_kSecret + scramble_key_offset);
      a.stripes_in_block = 0;
    }
  }
  if (stripes > 0) std::memcpy(a.last_stripe, src + (stripes - 1) * stripe, stripe);
}

#if KVPARK_X86_KERNELS

// --- AVX2: two 32-byte halves per stripe -----------------------------------------

__attribute__((target("avx2"))) inline __m256i accumulate_avx2(__m256i lanes, __m256i data,
                                                               const uint8_t* key) {
  const __m256i keyed = _mm256_xor_si256(data, _mm256_loadu_si256((const __m256i*)key));
  const __m256i keyed_high = _mm256_shuffle_epi32(keyed, _MM_SHUFFLE(0, 3, 0, 1));
  const __m256i product = _mm256_mul_epu32(keyed, keyed_high);
  const __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
  return _mm256_add_epi64(product, _mm256_add_epi64(lanes, swapped));
}

__attribute__((target("avx2"))) inline __m256i scramble_avx2(__m256i lanes, const uint8_t* key) {
  const __m256i prime = _mm256_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  const __m256i mixed = _mm256_xor_si256(lanes, _mm256_srli_epi64(lanes, 47));
  const __m256i keyed = _mm256_xor_si256(mixed, _mm256_loadu_si256((const __m256i*)key));
  const __m256i keyed_high = _mm256_shuffle_epi32(keyed, _MM_SHUFFLE(0, 3, 0, 1));
  return _mm256_add_epi64(_mm256_mul_epu32(keyed, prime),
                          _mm256_slli_epi64(_mm256_mul_epu32(keyed_high, prime), 32));
}

template <Store store>
__attribute__((target("avx2"))) void consume_avx2_with(CopyXxh3::Accumulator& a, uint8_t* dst,
                                                       const uint8_t* src, size_t stripes) {
  __m256i low = _mm256_load_si256((const __m256i*)a.lanes);
  __m256i high = _mm256_load_si256((const __m256i*)(a.lanes + 4));
  __m256i data_low = _mm256_setzero_si256();
  __m256i data_high = _mm256_setzero_si256();
  size_t in_block = a.stripes_in_block;
  for (size_t s = 0; s < stripes; ++s) {
    const uint8_t* in = src + s * stripe;
    _mm_prefetch((const char*)(in + prefetch_distance_bytes), _MM_HINT_T0);
    data_low = _mm256_loadu_si256((const __m256i*)in);
    data_high = _mm256_loadu_si256((const __m256i*)(in + 32));
    if constexpr (store == Store::streaming) {
      _mm256_stream_si256((__m256i*)(dst + s * stripe), data_low);
      _mm256_stream_si256((__m256i*)(dst + s * stripe + 32), data_high);
    } else {
      _mm256_storeu_si256((__m256i*)(dst + s * stripe), data_low);
      _mm256_storeu_si256((__m256i*)(dst + s * stripe + 32), data_high);
    }
    const uint8_t* key = XXH3_kSecret + in_block * secret_step;
    low = accumulate_avx2(low, data_low, key);
    high = accumulate_avx2(high, data_high, key + 32);
    if (++in_block == stripes_per_block) {
      low = scramble_avx2(low, XXH3_kSecret + scramble_key_offset);
      high = scramble_avx2(high, XXH3_kSecret + scramble_key_offset + 32);
      in_block = 0;
    }
  }
  if constexpr (store == Store::streaming) _mm_sfence();  // visible before the seal is sent
  _mm256_store_si256((__m256i*)a.lanes, low);
  _mm256_store_si256((__m256i*)(a.lanes + 4), high);
  a.stripes_in_block = in_block;
  if (stripes > 0) {
    _mm256_storeu_si256((__m256i*)a.last_stripe, data_low);
    _mm256_storeu_si256((__m256i*)(a.last_stripe + 32), data_high);
  }
}

// --- AVX-512: one register per stripe ---------------------------------------------

__attribute__((target("avx512f"))) inline __m512i accumulate_avx512(__m512i lanes, __m512i data,
                                                                    const uint8_t* key) {
  const __m512i keyed = _mm512_xor_si512(data, _mm512_loadu_si512(key));
  const __m512i keyed_high = _mm512_shuffle_epi32(keyed, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
  const __m512i product = _mm512_mul_epu32(keyed, keyed_high);
  const __m512i swapped = _mm512_shuffle_epi32(data, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2));
  return _mm512_add_epi64(product, _mm512_add_epi64(lanes, swapped));
}

__attribute__((target("avx512f"))) inline __m512i scramble_avx512(__m512i lanes,
                                                                  const uint8_t* key) {
  const __m512i prime = _mm512_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  const __m512i mixed = _mm512_xor_si512(lanes, _mm512_srli_epi64(lanes, 47));
  const __m512i keyed = _mm512_xor_si512(mixed, _mm512_loadu_si512(key));
  const __m512i keyed_high = _mm512_shuffle_epi32(keyed, (_MM_PERM_ENUM)_MM_SHUFFLE(0, 3, 0, 1));
  return _mm512_add_epi64(_mm512_mul_epu32(keyed, prime),
                          _mm512_slli_epi64(_mm512_mul_epu32(keyed_high, prime), 32));
}

template <Store store>
__attribute__((target("avx512f"))) void consume_avx512_with(CopyXxh3::Accumulator& a, uint8_t* dst,
                                                            const uint8_t* src, size_t stripes) {
  __m512i lanes = _mm512_load_si512(a.lanes);
  __m512i data = _mm512_setzero_si512();
  size_t in_block = a.stripes_in_block;
  for (size_t s = 0; s < stripes; ++s) {
    const uint8_t* in = src + s * stripe;
    _mm_prefetch((const char*)(in + prefetch_distance_bytes), _MM_HINT_T0);
    data = _mm512_loadu_si512(in);
    if constexpr (store == Store::streaming) {
      _mm512_stream_si512((__m512i*)(dst + s * stripe), data);
    } else {
      _mm512_storeu_si512(dst + s * stripe, data);
    }
    lanes = accumulate_avx512(lanes, data, XXH3_kSecret + in_block * secret_step);
    if (++in_block == stripes_per_block) {
      lanes = scramble_avx512(lanes, XXH3_kSecret + scramble_key_offset);
      in_block = 0;
    }
  }
  if constexpr (store == Store::streaming) _mm_sfence();  // visible before the seal is sent
  _mm512_store_si512(a.lanes, lanes);
  a.stripes_in_block = in_block;
  if (stripes > 0) _mm512_storeu_si512(a.last_stripe, data);
}

#endif  // KVPARK_X86_KERNELS

// Non-temporal stores need the destination aligned to the kernel's vector.
size_t streaming_alignment(CopyKernel kernel) {
  return kernel == CopyKernel::avx512 ? 64 : 32;
}

void consume(CopyKernel kernel, CopyXxh3::Accumulator& a, uint8_t* dst, const uint8_t* src,
             size_t stripes, Store store) {
#if KVPARK_X86_KERNELS
  const bool streaming = store == Store::streaming;
  if (kernel == CopyKernel::avx512) {
    return streaming ? consume_avx512_with<Store::streaming>(a, dst, src, stripes)
                     : consume_avx512_with<Store::cached>(a, dst, src, stripes);
  }
  assert(kernel == CopyKernel::avx2);
  return streaming ? consume_avx2_with<Store::streaming>(a, dst, src, stripes)
                   : consume_avx2_with<Store::cached>(a, dst, src, stripes);
#else
  (void)kernel, (void)a, (void)dst, (void)src, (void)stripes, (void)store;
  assert(!"no vector kernel on this architecture");
#endif
}

// Pieces that pass through a private buffer (the portable kernel's, and every
// kernel's into a misaligned destination): small enough to stay in L1.
constexpr size_t portable_piece_bytes = 8 * 1024;
constexpr size_t unaligned_piece_bytes = 4 * 1024;

#if KVPARK_X86_KERNELS
// The bytes of `bytes` before dst's first vector boundary, so that every store after
// them is aligned.
size_t head_bytes(const uint8_t* dst, size_t bytes, size_t vector_bytes) {
  const size_t misalignment = reinterpret_cast<uintptr_t>(dst) % vector_bytes;
  return std::min(bytes, (vector_bytes - misalignment) % vector_bytes);
}

__attribute__((target("avx512f"))) void stream_store_avx512(uint8_t* dst, const uint8_t* from,
                                                            size_t bytes) {
  size_t i = head_bytes(dst, bytes, 64);
  std::memcpy(dst, from, i);
  for (; i + 64 <= bytes; i += 64)
    _mm512_stream_si512((__m512i*)(dst + i), _mm512_loadu_si512(from + i));
  std::memcpy(dst + i, from + i, bytes - i);
}

__attribute__((target("avx2"))) void stream_store_avx2(uint8_t* dst, const uint8_t* from,
                                                       size_t bytes) {
  size_t i = head_bytes(dst, bytes, 32);
  std::memcpy(dst, from, i);
  for (; i + 32 <= bytes; i += 32) {
    _mm256_stream_si256((__m256i*)(dst + i), _mm256_loadu_si256((const __m256i*)(from + i)));
  }
  std::memcpy(dst + i, from + i, bytes - i);
}

void stream_store_sse2(uint8_t* dst, const uint8_t* from, size_t bytes) {
  size_t i = head_bytes(dst, bytes, 16);
  std::memcpy(dst, from, i);
  for (; i + 16 <= bytes; i += 16) {
    _mm_stream_si128((__m128i*)(dst + i), _mm_loadu_si128((const __m128i*)(from + i)));
  }
  std::memcpy(dst + i, from + i, bytes - i);
}
#endif

// Stores `bytes` from a private buffer to dst around the cache where the CPU can,
// at any alignment of dst: the bytes before its first and after its last vector
// boundary go through the cache. The caller fences (store_fence) once it is done.
void stream_store(CopyKernel kernel, uint8_t* dst, const uint8_t* from, size_t bytes) {
#if KVPARK_X86_KERNELS
  if (kernel == CopyKernel::avx512) return stream_store_avx512(dst, from, bytes);
  if (kernel == CopyKernel::avx2) return stream_store_avx2(dst, from, bytes);
  stream_store_sse2(dst, from, bytes);  // SSE2 is every x86-64
#else
  (void)kernel;
  std::memcpy(dst, from, bytes);
#endif
}

// Non-temporal stores are weakly ordered: fence them before the copy returns (the
// seal or the engine's read that follows must see them).
void store_fence() {
#if KVPARK_X86_KERNELS
  _mm_sfence();
#endif
}

}  // namespace

bool copy_kernel_supported(CopyKernel kernel) {
  switch (kernel) {
    case CopyKernel::portable:
      return true;
#if KVPARK_X86_KERNELS
    // libgcc's cpu model also checks that the kernel saves the vector registers (XGETBV).
    case CopyKernel::avx2:
      return __builtin_cpu_supports("avx2");
    case CopyKernel::avx512:
      return __builtin_cpu_supports("avx512f");
#else
    case CopyKernel::avx2:
    case CopyKernel::avx512:
      return false;
#endif
  }
  return false;
}

CopyKernel best_copy_kernel() {
  static const CopyKernel best = copy_kernel_supported(CopyKernel::avx512) ? CopyKernel::avx512
                                 : copy_kernel_supported(CopyKernel::avx2) ? CopyKernel::avx2
                                                                           : CopyKernel::portable;
  return best;
}

const char* copy_kernel_name(CopyKernel kernel) {
  switch (kernel) {
    case CopyKernel::portable:
      return "portable";
    case CopyKernel::avx2:
      return "avx2";
    case CopyKernel::avx512:
      return "avx512";
  }
  return "?";
}

struct CopyXxh3::Portable {
  XXH3_state_t state;
};

CopyXxh3::CopyXxh3(CopyStores stores, CopyKernel kernel)
    : kernel_(kernel),
      streaming_(stores == CopyStores::by_size),
      accumulator_{.lanes = XXH3_INIT_ACC} {
  assert(copy_kernel_supported(kernel));
  if (kernel == CopyKernel::portable) {
    portable_ = std::make_unique<Portable>();
    XXH3_64bits_reset(&portable_->state);
  }
}

CopyXxh3::~CopyXxh3() = default;

void CopyXxh3::copy(void* dst_bytes, const void* src_bytes, size_t count) {
  if (count == 0) return;
  auto* dst = static_cast<uint8_t*>(dst_bytes);
  const auto* src = static_cast<const uint8_t*>(src_bytes);
  total_bytes_ += count;
  if (portable_) {
    alignas(64) uint8_t piece[portable_piece_bytes];
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(portable_piece_bytes, count - done);
      std::memcpy(piece, src + done, n);
      XXH3_64bits_update(&portable_->state, piece, n);
      if (streaming_ && count >= limits::streaming_copy_min_bytes) {
        stream_store(kernel_, dst + done, piece, n);
      } else {
        std::memcpy(dst + done, piece, n);
      }
      done += n;
    }
    store_fence();
    return;
  }
  if (buffered_ + count <= buffer_bytes) {
    std::memcpy(buffer_ + buffered_, src, count);
    std::memcpy(dst, buffer_ + buffered_, count);
    buffered_ += count;
    return;
  }
  if (buffered_ > 0) {  // complete the buffer and fold it in: more input follows it
    const size_t fill = buffer_bytes - buffered_;
    std::memcpy(buffer_ + buffered_, src, fill);
    std::memcpy(dst, buffer_ + buffered_, fill);
    fold_scalar(accumulator_, buffer_, buffer_bytes / stripe);
    buffered_ = 0;
    src += fill;
    dst += fill;
    count -= fill;
  }
  // Fold in every whole stripe but keep 1 to 64 bytes back: the last stripe of the
  // stream is hashed with its own key at digest().
  const size_t stripes = (count - 1) / stripe;
  if (!streaming_ || count < limits::streaming_copy_min_bytes) {
    consume(kernel_, accumulator_, dst, src, stripes, Store::cached);
  } else if (reinterpret_cast<uintptr_t>(dst) % streaming_alignment(kernel_) == 0) {
    consume(kernel_, accumulator_, dst, src, stripes, Store::streaming);
  } else {
    // A destination off the vector's alignment (malloc gives 16 bytes) takes the
    // stripes through an L1-resident piece, stored on from there around the cache.
    alignas(64) uint8_t piece[unaligned_piece_bytes];
    for (size_t s = 0; s < stripes;) {
      const size_t n = std::min(unaligned_piece_bytes / stripe, stripes - s);
      consume(kernel_, accumulator_, piece, src + s * stripe, n, Store::cached);
      stream_store(kernel_, dst + s * stripe, piece, n * stripe);
      s += n;
    }
    store_fence();
  }
  const size_t done = stripes * stripe;
  buffered_ = count - done;
  std::memcpy(buffer_, src + done, buffered_);
  std::memcpy(dst + done, buffer_, buffered_);
}

uint64_t CopyXxh3::digest() const {
  if (portable_) return XXH3_64bits_digest(&portable_->state);
  if (total_bytes_ <= XXH3_MIDSIZE_MAX) return XXH3_64bits(buffer_, total_bytes_);  // all here
  Accumulator a = accumulator_;
  uint8_t last[stripe];
  if (buffered_ >= stripe) {
    fold_scalar(a, buffer_, (buffered_ - 1) / stripe);
    std::memcpy(last, buffer_ + buffered_ - stripe, stripe);
  } else {  // the last stripe reaches back into the one folded in before
    const size_t earlier = stripe - buffered_;
    std::memcpy(last, a.last_stripe + stripe - earlier, earlier);
    std::memcpy(last + earlier, buffer_, buffered_);
  }
  accumulate_scalar(a.lanes, last, XXH3_kSecret + last_stripe_key_offset);
  return XXH3_mergeAccs(a.lanes, XXH3_kSecret + merge_key_offset, total_bytes_ * XXH_PRIME64_1);
}

}  // namespace kvpark::client
