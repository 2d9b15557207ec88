// kvpark_kernels.h — paged-KV gather (park) and scatter (restore), CPU reference.
//
// Model. An engine keeps its KV cache in pages: per layer one K and one V tensor (or one
// fused KV tensor), each an array of `pages_total` pages of `page_tokens` token slots. A
// sequence maps its logical page i (tokens [i*page_tokens, (i+1)*page_tokens)) to a
// physical page id through a page table. A transfer moves the token range
// [first_token, first_token + n_tokens) of one sequence, all layers (or a layer subrange),
// between the cache and *block images*: the range is cut into blocks of `block_tokens`
// tokens (the last block may be shorter), and each block has its own image. Elements are
// raw bytes of `elem_bytes` (1, 2 or 4); nothing is converted.
//
// Cache layouts, per layer tensor (E = elem_bytes, PT = page_tokens, H = kv_heads, D = head_dim):
//   nhd, separate: K and V each [pages][PT][H][D]
//   hnd, separate: K and V each [pages][H][PT][D]
//   nhd, fused:    KV          [pages][2][PT][H][D]   (index 0 = K, 1 = V; flashinfer NHD)
//   hnd, fused:    KV          [pages][2][H][PT][D]   (flashinfer HND)
// vLLM's [2][pages][PT][H][D] tensor is "nhd, separate" with v = k + pages*PT*H*D*E.
//
// Block image of t tokens (see docs/kernels.md): [layers][2 (K,V)][t][H][D] elements, dense,
// no header. It depends on neither the page size nor the layout's page placement, so a
// block parked from any page table restores into any other; layer-major order keeps each
// layer's K and V in one contiguous span, so a restore can proceed layer by layer.
//
// Invariants: a transfer touches exactly the bytes of its token range and layer subrange,
// in the cache and in the images; gather followed by scatter is bit-exact; validation
// failures return a KernelStatus before any byte is touched.
#pragma once

#include <cstdint>

namespace kvpark::kernels {

// Limits. layers_max bounds the per-layer pointer table that the CUDA launch passes by value.
inline constexpr uint32_t layers_max = 128;
inline constexpr uint32_t kv_heads_max = 1024;
inline constexpr uint32_t head_dim_max = 4096;             // elements
inline constexpr uint32_t page_tokens_max = 4096;          // tokens
inline constexpr uint32_t transfer_tokens_max = 1u << 20;  // tokens per call
inline constexpr uint32_t pages_total_max = INT32_MAX;     // page ids are int32
// One image row and the CUDA launch's 32-bit row index must fit; see the .cu file.
static_assert(uint64_t{layers_max} * 2 * transfer_tokens_max <= UINT32_MAX,
              "rows of one transfer are indexed with 32 bits on the device");

enum class KvLayout : uint8_t {
  nhd,  // token slot before head: [page][slot][head][dim]
  hnd,  // head before token slot: [page][head][slot][dim]
};

enum class KvFusion : uint8_t {
  separate,  // one K and one V tensor per layer
  fused,     // one tensor per layer, K and V interleaved per page
};

// Closed set of outcomes; every function here returns one of these and nothing else.
enum class KernelStatus : uint8_t {
  ok,
  bad_geometry,  // a dimension is 0 or over its limit, elem_bytes not 1/2/4, or sizes overflow
  bad_range,     // empty/oversized token range, page table too short, or bad layer subrange
  bad_page_id,   // a page id in the range is negative or >= pages_total
  bad_pointer,   // a required pointer is null, or v is given for a fused cache
  device_unavailable,  // CUDA not built in, or no usable device
  device_error,        // the CUDA runtime reported an error (see ret_device_error)
};

// Human-readable name of a status ("bad_geometry"); never null.
const char* kernel_status_name(KernelStatus status);

struct KvCacheGeometry {
  uint32_t layers = 0;
  uint32_t pages_total = 0;  // pages in each layer tensor; valid page ids are [0, pages_total)
  uint32_t page_tokens = 0;  // token slots per page
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;    // elements
  uint32_t elem_bytes = 0;  // 1, 2 or 4
  KvLayout layout = KvLayout::nhd;
  KvFusion fusion = KvFusion::separate;
};

struct PagedKvCache {
  KvCacheGeometry geometry;
  void* const* k = nullptr;  // [layers] K tensor base per layer; fused: the KV tensor base
  void* const* v = nullptr;  // [layers] V tensor base per layer; must be null when fused
};

inline constexpr uint32_t layers_all = 0;  // BlockTransfer::layer_count: through the last layer

// One call's worth of work. Pointer arrays are read by the side that executes the copy:
// host memory for *_cpu; device-accessible memory (device or mapped pinned) for *_cuda,
// except that cache.k / cache.v themselves are host arrays of device pointers.
struct BlockTransfer {
  const int32_t* page_table = nullptr;  // [page_table_len] physical page of each logical page
  uint32_t page_table_len = 0;          // must cover the last token of the range
  uint64_t first_token = 0;             // sequence position of the first token moved
  uint32_t n_tokens = 0;                // tokens moved, 1..transfer_tokens_max
  uint32_t block_tokens = 0;            // tokens per block image; the last may hold fewer
  void* const* block_images = nullptr;  // [ceil(n_tokens / block_tokens)] one image per block
  uint32_t layer_first = 0;             // layers [layer_first, layer_first + layer_count)
  uint32_t layer_count = layers_all;
};

// Bytes of one token of one layer's K (or V) in an image: kv_heads * head_dim * elem_bytes.
uint64_t image_row_bytes(const KvCacheGeometry& geometry);
// Bytes of a block image holding `tokens` tokens: layers * 2 * tokens * image_row_bytes.
uint64_t image_bytes(const KvCacheGeometry& geometry, uint32_t tokens);
// Byte offset, in an image of `tokens` tokens, of layer `layer`'s K (kv = 0) or V (kv = 1).
uint64_t image_span_offset(const KvCacheGeometry& geometry, uint32_t tokens, uint32_t layer,
                           uint32_t kv);

// Checks geometry and that every layer tensor's size fits in the address space.
KernelStatus validate_geometry(const KvCacheGeometry& geometry);
// Checks geometry, pointers and the range; does not read the page table's contents.
KernelStatus validate_transfer(const PagedKvCache& cache, const BlockTransfer& transfer);
// validate_transfer, then the arrays' contents, read on the host: every page id the range
// touches is in [0, pages_total) (else bad_page_id) and every block image is non-null.
KernelStatus validate_transfer_arrays(const PagedKvCache& cache, const BlockTransfer& transfer);

// Park: cache -> block images. Validates fully (validate_transfer_arrays) before copying.
KernelStatus gather_cpu(const PagedKvCache& cache, const BlockTransfer& transfer);
// Restore: block images -> cache. Validates fully before copying; touches only the range.
KernelStatus scatter_cpu(const PagedKvCache& cache, const BlockTransfer& transfer);

}  // namespace kvpark::kernels
