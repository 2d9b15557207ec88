// device_test_util.h — shared by the device API tests: a namespace whose block payload is one
// block image of a test geometry, the kvpark_kv_cache view of a TestCache, and the per-element
// expectation of a restore.
//
// Model. Expectations never use the kernels' arithmetic: `copy_reference` moves one element at
// a time through TestCache::element (the layout table of kvpark_kernels.h), so a cache restored
// through the device API must equal a TestCache built from the same seed with that copy applied.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "client/kvpark_device.h"
#include "kv_test_cache.h"
#include "kvpark_kernels.h"
#include "tests/testing/content.h"

namespace kvpark::device_testing {

using kernels::KvCacheGeometry;
using kernels::KvFusion;
using kernels::KvLayout;
using kernels::testing::TestCache;

inline constexpr uint32_t block_tokens = 16;
inline constexpr uint32_t page_tokens = 6;  // does not divide block_tokens
inline constexpr uint32_t blocks = 5;
inline constexpr uint32_t prompt_tokens = blocks * block_tokens + 3;  // a tail to prefill

inline KvCacheGeometry geometry(KvLayout layout, KvFusion fusion, uint32_t elem_bytes = 2,
                                uint32_t layers = 3, uint32_t kv_heads = 2, uint32_t head_dim = 8) {
  return {.layers = layers,
          .pages_total = 48,
          .page_tokens = page_tokens,
          .kv_heads = kv_heads,
          .head_dim = head_dim,
          .elem_bytes = elem_bytes,
          .layout = layout,
          .fusion = fusion};
}

inline kvpark_namespace block_namespace(uint64_t ns_low, const KvCacheGeometry& g) {
  kvpark_namespace ns{};
  ns.id = {ns_low, 0x64657669636521};
  ns.block_tokens = block_tokens;
  ns.block_payload_bytes = kernels::image_bytes(g, block_tokens);
  ns.client_name = "device-test";
  return ns;
}

// The C view of a cache whose tensors live in `k` / `v` (host or device addresses).
inline kvpark_kv_cache kv_cache(const KvCacheGeometry& g, void* const* k, void* const* v,
                                kvpark_kv_memory memory) {
  kvpark_kv_cache c{};
  c.layers = g.layers;
  c.pages_total = g.pages_total;
  c.page_tokens = g.page_tokens;
  c.kv_heads = g.kv_heads;
  c.head_dim = g.head_dim;
  c.elem_bytes = g.elem_bytes;
  c.layout = g.layout == KvLayout::nhd ? KVPARK_KV_NHD : KVPARK_KV_HND;
  c.fusion = g.fusion == KvFusion::fused ? KVPARK_KV_FUSED : KVPARK_KV_SEPARATE;
  c.memory = memory;
  c.cuda_device = 0;
  c.k = k;
  c.v = g.fusion == KvFusion::fused ? nullptr : v;
  return c;
}

inline kvpark_kv_cache host_cache(TestCache& cache) {
  kernels::PagedKvCache p = cache.cache();
  return kv_cache(cache.geometry(), p.k, p.v, KVPARK_MEMORY_HOST);
}

// Copies tokens [first, first + n) of layers [layer_first, layer_end) from `src` (pages
// `src_pages`) into `dst` (pages `dst_pages`), one element at a time.
inline void copy_reference(TestCache& src, const std::vector<int32_t>& src_pages, TestCache& dst,
                           const std::vector<int32_t>& dst_pages, uint64_t first, uint64_t n,
                           uint32_t layer_first = 0, uint32_t layer_end = UINT32_MAX) {
  const KvCacheGeometry& g = src.geometry();
  layer_end = std::min(layer_end, g.layers);
  for (uint64_t t = first; t < first + n; ++t) {
    const auto sp = static_cast<uint32_t>(src_pages[t / g.page_tokens]);
    const auto dp = static_cast<uint32_t>(dst_pages[t / g.page_tokens]);
    const auto slot = static_cast<uint32_t>(t % g.page_tokens);
    for (uint32_t l = layer_first; l < layer_end; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint32_t h = 0; h < g.kv_heads; ++h) {
          for (uint32_t d = 0; d < g.head_dim; ++d) {
            std::memcpy(dst.element(l, kv, dp, slot, h, d), src.element(l, kv, sp, slot, h, d),
                        g.elem_bytes);
          }
        }
      }
    }
  }
}

// The bytes of one layer's tensors (K then V, or the fused KV).
inline std::vector<uint8_t> layer_bytes(TestCache& cache, uint32_t layer) {
  std::vector<uint8_t> bytes = cache.k_tensors()[layer];
  if (!cache.v_tensors().empty()) {
    const auto& v = cache.v_tensors()[layer];
    bytes.insert(bytes.end(), v.begin(), v.end());
  }
  return bytes;
}

// The reference image of block `block` of a sequence cached in `src` through `pages`.
inline std::vector<uint8_t> reference_image(TestCache& src, const std::vector<int32_t>& pages,
                                            uint32_t block) {
  const kernels::BlockTransfer t{.page_table = pages.data(),
                                 .page_table_len = static_cast<uint32_t>(pages.size()),
                                 .first_token = uint64_t{block} * block_tokens,
                                 .n_tokens = block_tokens,
                                 .block_tokens = block_tokens};
  std::vector<std::vector<uint8_t>> images = kernels::testing::make_images(src.geometry(), t, 0);
  src.reference_gather(t, images);
  return images[0];
}

inline uint32_t pages_for(uint64_t tokens) {
  return static_cast<uint32_t>((tokens + page_tokens - 1) / page_tokens);
}

inline std::vector<int32_t> prompt(uint64_t seed) {
  return testing::make_tokens(seed, prompt_tokens);
}

}  // namespace kvpark::device_testing
