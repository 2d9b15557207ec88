// validate.cpp — descriptor validation and block image arithmetic.
//
// Model. Validation is the one gate between caller-supplied descriptors and raw pointer
// arithmetic: after validate_transfer returns ok, every size product used by the copy paths
// fits in uint64_t and every index is in range, so the copy paths only assert.
#include <cassert>
#include <cstdint>

#include "kvpark_kernels.h"
#include "transfer_plan.h"

namespace kvpark::kernels {

namespace {

constexpr uint64_t tensor_bytes_max = uint64_t{1} << 62;  // bytes; far above any real tensor

bool mul_fits(uint64_t a, uint64_t b, uint64_t limit, uint64_t* ret_product) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product) || product > limit) return false;
  *ret_product = product;
  return true;
}

uint32_t blocks_in(uint32_t n_tokens, uint32_t block_tokens) {
  return n_tokens / block_tokens + (n_tokens % block_tokens != 0 ? 1 : 0);
}

}  // namespace

const char* kernel_status_name(KernelStatus status) {
  switch (status) {
    case KernelStatus::ok:
      return "ok";
    case KernelStatus::bad_geometry:
      return "bad_geometry";
    case KernelStatus::bad_range:
      return "bad_range";
    case KernelStatus::bad_page_id:
      return "bad_page_id";
    case KernelStatus::bad_pointer:
      return "bad_pointer";
    case KernelStatus::device_unavailable:
      return "device_unavailable";
    case KernelStatus::device_error:
      return "device_error";
  }
  return "unknown";
}

uint64_t image_row_bytes(const KvCacheGeometry& geometry) {
  return uint64_t{geometry.kv_heads} * geometry.head_dim * geometry.elem_bytes;
}

uint64_t image_bytes(const KvCacheGeometry& geometry, uint32_t tokens) {
  return uint64_t{geometry.layers} * 2 * tokens * image_row_bytes(geometry);
}

uint64_t image_span_offset(const KvCacheGeometry& geometry, uint32_t tokens, uint32_t layer,
                           uint32_t kv) {
  assert(layer < geometry.layers && kv < 2);
  return (uint64_t{layer} * 2 + kv) * tokens * image_row_bytes(geometry);
}

KernelStatus validate_geometry(const KvCacheGeometry& g) {
  if (g.layers == 0 || g.layers > layers_max) return KernelStatus::bad_geometry;
  if (g.pages_total == 0 || g.pages_total > pages_total_max) return KernelStatus::bad_geometry;
  if (g.page_tokens == 0 || g.page_tokens > page_tokens_max) return KernelStatus::bad_geometry;
  if (g.kv_heads == 0 || g.kv_heads > kv_heads_max) return KernelStatus::bad_geometry;
  if (g.head_dim == 0 || g.head_dim > head_dim_max) return KernelStatus::bad_geometry;
  if (g.elem_bytes != 1 && g.elem_bytes != 2 && g.elem_bytes != 4) {
    return KernelStatus::bad_geometry;
  }
  if (g.layout != KvLayout::nhd && g.layout != KvLayout::hnd) return KernelStatus::bad_geometry;
  if (g.fusion != KvFusion::separate && g.fusion != KvFusion::fused) {
    return KernelStatus::bad_geometry;
  }
  // Each factor is bounded by its limit, so only the page count can overflow the tensor size.
  const TransferPlan plan = make_transfer_plan(g);
  uint64_t tensor_bytes = 0;
  if (!mul_fits(plan.page_stride, g.pages_total, tensor_bytes_max, &tensor_bytes)) {
    return KernelStatus::bad_geometry;
  }
  return KernelStatus::ok;
}

KernelStatus validate_transfer(const PagedKvCache& cache, const BlockTransfer& t) {
  const KvCacheGeometry& g = cache.geometry;
  if (KernelStatus status = validate_geometry(g); status != KernelStatus::ok) return status;

  if (t.n_tokens == 0 || t.n_tokens > transfer_tokens_max) return KernelStatus::bad_range;
  if (t.block_tokens == 0 || t.block_tokens > transfer_tokens_max) return KernelStatus::bad_range;
  if (t.layer_first >= g.layers) return KernelStatus::bad_range;
  if (t.layer_count != layers_all && t.layer_count > g.layers - t.layer_first) {
    return KernelStatus::bad_range;
  }
  uint64_t last_token = 0;
  if (__builtin_add_overflow(t.first_token, uint64_t{t.n_tokens} - 1, &last_token)) {
    return KernelStatus::bad_range;
  }
  const uint64_t pages_needed = last_token / g.page_tokens + 1;
  if (pages_needed > t.page_table_len) return KernelStatus::bad_range;

  if (cache.k == nullptr || t.page_table == nullptr || t.block_images == nullptr) {
    return KernelStatus::bad_pointer;
  }
  const bool fused = g.fusion == KvFusion::fused;
  if (fused != (cache.v == nullptr)) return KernelStatus::bad_pointer;
  const uint32_t layer_end = t.layer_first + transfer_layer_count(g, t);
  for (uint32_t layer = t.layer_first; layer < layer_end; ++layer) {
    if (cache.k[layer] == nullptr) return KernelStatus::bad_pointer;
    if (!fused && cache.v[layer] == nullptr) return KernelStatus::bad_pointer;
  }
  return KernelStatus::ok;
}

KernelStatus validate_transfer_arrays(const PagedKvCache& cache, const BlockTransfer& t) {
  if (KernelStatus status = validate_transfer(cache, t); status != KernelStatus::ok) {
    return status;
  }
  const uint32_t page_tokens = cache.geometry.page_tokens;
  const uint64_t page_first = t.first_token / page_tokens;
  const uint64_t page_last = (t.first_token + t.n_tokens - 1) / page_tokens;
  for (uint64_t page = page_first; page <= page_last; ++page) {
    const int32_t id = t.page_table[page];
    if (id < 0 || static_cast<uint32_t>(id) >= cache.geometry.pages_total) {
      return KernelStatus::bad_page_id;
    }
  }
  const uint32_t blocks = blocks_in(t.n_tokens, t.block_tokens);
  for (uint32_t block = 0; block < blocks; ++block) {
    if (t.block_images[block] == nullptr) return KernelStatus::bad_pointer;
  }
  return KernelStatus::ok;
}

}  // namespace kvpark::kernels
