// bench_cases.h — the geometries kvpark-kernels-bench measures, shared by its CPU and GPU parts.
//
// Model. A case is a cache layout plus a page size; the model dimensions are fixed at those of
// a typical 8B-class GQA model in fp16 (32 layers, 8 KV heads of 128), so one token is
// 128 KiB of K+V across layers. A transfer moves `tokens` tokens starting at a block boundary
// (bench_first_token) through a scattered page table, one image per block of block_tokens,
// as a park or restore of a real sequence does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvpark_kernels.h"

namespace kvpark::bench {

inline constexpr uint32_t bench_layers = 32;
inline constexpr uint32_t bench_kv_heads = 8;
inline constexpr uint32_t bench_head_dim = 128;     // elements
inline constexpr uint32_t bench_elem_bytes = 2;     // fp16/bf16
inline constexpr uint32_t bench_block_tokens = 64;  // tokens per block image
inline constexpr uint32_t bench_page_tokens[] = {16, 32, 64};
inline constexpr uint64_t bench_first_token = bench_block_tokens;  // the sequence's 2nd block

struct BenchLayout {
  kernels::KvLayout layout;
  kernels::KvFusion fusion;
  const char* name;
};
inline constexpr BenchLayout bench_layouts[] = {
    {kernels::KvLayout::nhd, kernels::KvFusion::separate, "nhd"},
    {kernels::KvLayout::hnd, kernels::KvFusion::separate, "hnd"},
    {kernels::KvLayout::nhd, kernels::KvFusion::fused, "nhd-fused"},
    {kernels::KvLayout::hnd, kernels::KvFusion::fused, "hnd-fused"},
};

// Geometry with room for twice the transferred tokens, so the page table can scatter.
inline kernels::KvCacheGeometry bench_geometry(const BenchLayout& layout, uint32_t page_tokens,
                                               uint32_t tokens) {
  return kernels::KvCacheGeometry{.layers = bench_layers,
                                  .pages_total = 2 * tokens / page_tokens + 2,
                                  .page_tokens = page_tokens,
                                  .kv_heads = bench_kv_heads,
                                  .head_dim = bench_head_dim,
                                  .elem_bytes = bench_elem_bytes,
                                  .layout = layout.layout,
                                  .fusion = layout.fusion};
}

// Page ids for a sequence whose range starts at `first_token`: a seeded shuffle of all pages.
inline std::vector<int32_t> bench_page_table(const kernels::KvCacheGeometry& g,
                                             uint64_t first_token, uint32_t tokens) {
  const auto len = static_cast<uint32_t>((first_token + tokens - 1) / g.page_tokens + 1);
  std::vector<int32_t> ids(g.pages_total);
  for (uint32_t i = 0; i < g.pages_total; ++i) ids[i] = static_cast<int32_t>(i);
  std::mt19937 rng(42);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(len);
  return ids;
}

inline std::string layout_label(const BenchLayout& layout, uint32_t page_tokens) {
  return std::string(layout.name) + "/p" + std::to_string(page_tokens);
}

#ifdef KVPARK_KERNELS_CUDA
// GPU restore/park benchmark (gpu_bench.cpp); returns the process exit status.
int run_gpu_bench(uint32_t tokens, uint32_t reps);
#endif

}  // namespace kvpark::bench
