// transfer_plan.h — internal: a validated geometry reduced to byte strides.
//
// Model. Every layout in kvpark_kernels.h is one address formula with different strides:
//   cache byte of (page p, head h, slot s, byte b of the head's D*E bytes), K or V of a layer =
//     base_kv + p * page_stride + h * head_stride + s * slot_stride + b
//   where base_kv = k[layer] for K; v[layer] (separate) or k[layer] + v_offset (fused) for V.
// A *unit* is the largest piece contiguous both in the cache and in an image row:
//   nhd: a whole token row (H*D*E bytes, one unit per row); hnd: one head (D*E bytes, H units).
// Image byte of (layer, kv, token j of a block of t tokens, unit u) =
//   ((layer * 2 + kv) * t + j) * row_bytes + u * unit_bytes.
// Shared by the CPU path and the CUDA path (compiled by nvcc too), so plain data only.
#pragma once

#include <cstdint>

#include "kvpark_kernels.h"

namespace kvpark::kernels {

struct TransferPlan {
  uint64_t row_bytes = 0;      // image bytes per (layer, kv, token)
  uint64_t unit_bytes = 0;     // contiguous run in both cache and image
  uint32_t units_per_row = 0;  // row_bytes / unit_bytes
  uint64_t page_stride = 0;    // bytes between pages of one layer tensor
  uint64_t head_stride = 0;    // bytes between heads within a page (unit u -> u * this)
  uint64_t slot_stride = 0;    // bytes between token slots within a page
  uint64_t v_offset = 0;       // fused: bytes from a page's K half to its V half
  bool fused = false;
};

// The plan for a geometry that validate_geometry accepted.
inline TransferPlan make_transfer_plan(const KvCacheGeometry& g) {
  TransferPlan plan;
  const uint64_t head_bytes = uint64_t{g.head_dim} * g.elem_bytes;
  const uint64_t page_half_bytes = head_bytes * g.kv_heads * g.page_tokens;  // one of K or V
  plan.row_bytes = head_bytes * g.kv_heads;
  plan.fused = g.fusion == KvFusion::fused;
  plan.page_stride = plan.fused ? 2 * page_half_bytes : page_half_bytes;
  plan.v_offset = plan.fused ? page_half_bytes : 0;
  if (g.layout == KvLayout::nhd) {
    plan.unit_bytes = plan.row_bytes;
    plan.units_per_row = 1;
    plan.head_stride = head_bytes;
    plan.slot_stride = plan.row_bytes;
  } else {
    plan.unit_bytes = head_bytes;
    plan.units_per_row = g.kv_heads;
    plan.head_stride = head_bytes * g.page_tokens;
    plan.slot_stride = head_bytes;
  }
  return plan;
}

// Layers a transfer covers, with layers_all resolved.
inline uint32_t transfer_layer_count(const KvCacheGeometry& g, const BlockTransfer& t) {
  return t.layer_count == layers_all ? g.layers - t.layer_first : t.layer_count;
}

}  // namespace kvpark::kernels
