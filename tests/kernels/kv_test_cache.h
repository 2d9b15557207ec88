// kv_test_cache.h — test helpers: a host paged KV cache with random bytes, block images, and
// the obvious per-element reference that the kernels are checked against.
//
// Model. The reference computes every element's cache offset straight from the layout
// definitions in kvpark_kernels.h (not from transfer_plan.h), one element at a time, so it
// shares no arithmetic with the code under test. Shared by tests/kernels and tests/gpu.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvpark_kernels.h"

namespace kvpark::kernels::testing {

// A paged cache in host memory: one byte vector per tensor (K and V, or fused KV) per layer.
class TestCache {
 public:
  TestCache(const KvCacheGeometry& geometry, uint32_t seed) : geometry_(geometry) {
    const bool fused = geometry.fusion == KvFusion::fused;
    const uint64_t half = tensor_half_bytes();
    std::mt19937 rng(seed);
    for (uint32_t layer = 0; layer < geometry.layers; ++layer) {
      k_.emplace_back(fused ? 2 * half : half);
      fill(k_.back(), rng);
      if (!fused) {
        v_.emplace_back(half);
        fill(v_.back(), rng);
      }
    }
    for (auto& t : k_) k_ptrs_.push_back(t.data());
    for (auto& t : v_) v_ptrs_.push_back(t.data());
  }

  PagedKvCache cache() const {
    return PagedKvCache{.geometry = geometry_,
                        .k = k_ptrs_.data(),
                        .v = v_ptrs_.empty() ? nullptr : v_ptrs_.data()};
  }
  const KvCacheGeometry& geometry() const { return geometry_; }
  std::vector<std::vector<uint8_t>>& k_tensors() { return k_; }
  std::vector<std::vector<uint8_t>>& v_tensors() { return v_; }

  // Bytes of one of K or V across all pages of one layer.
  uint64_t tensor_half_bytes() const {
    return uint64_t{geometry_.pages_total} * geometry_.page_tokens * geometry_.kv_heads *
           geometry_.head_dim * geometry_.elem_bytes;
  }

  // Address of element (page, slot, head, dim) of layer's K (kv = 0) or V (kv = 1), from the
  // layout table in kvpark_kernels.h.
  uint8_t* element(uint32_t layer, uint32_t kv, uint32_t page, uint32_t slot, uint32_t head,
                   uint32_t dim) {
    const KvCacheGeometry& g = geometry_;
    const uint64_t PT = g.page_tokens, H = g.kv_heads, D = g.head_dim, E = g.elem_bytes;
    const bool fused = g.fusion == KvFusion::fused;
    uint64_t index = 0;  // in elements
    if (g.layout == KvLayout::nhd) {
      index = fused ? (((uint64_t{page} * 2 + kv) * PT + slot) * H + head) * D + dim
                    : ((uint64_t{page} * PT + slot) * H + head) * D + dim;
    } else {
      index = fused ? (((uint64_t{page} * 2 + kv) * H + head) * PT + slot) * D + dim
                    : ((uint64_t{page} * H + head) * PT + slot) * D + dim;
    }
    std::vector<uint8_t>& tensor = (kv == 0 || fused) ? k_[layer] : v_[layer];
    return tensor.data() + index * E;
  }

  // Gather by the per-element definition into `images` (one vector per block).
  void reference_gather(const BlockTransfer& t, std::vector<std::vector<uint8_t>>& images) {
    for_each_element(t, images, [](uint8_t* cache_elem, uint8_t* image_elem, uint32_t bytes) {
      std::memcpy(image_elem, cache_elem, bytes);
    });
  }
  // Scatter by the per-element definition from `images`.
  void reference_scatter(const BlockTransfer& t, std::vector<std::vector<uint8_t>>& images) {
    for_each_element(t, images, [](uint8_t* cache_elem, uint8_t* image_elem, uint32_t bytes) {
      std::memcpy(cache_elem, image_elem, bytes);
    });
  }

  // A copy of every tensor's bytes, for before/after comparisons.
  std::vector<std::vector<uint8_t>> snapshot() const {
    std::vector<std::vector<uint8_t>> all(k_);
    all.insert(all.end(), v_.begin(), v_.end());
    return all;
  }

 private:
  static void fill(std::vector<uint8_t>& bytes, std::mt19937& rng) {
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  }

  template <typename Fn>
  void for_each_element(const BlockTransfer& t, std::vector<std::vector<uint8_t>>& images, Fn fn) {
    const KvCacheGeometry& g = geometry_;
    const uint32_t layer_end =
        t.layer_count == layers_all ? g.layers : t.layer_first + t.layer_count;
    for (uint32_t token = 0; token < t.n_tokens; ++token) {
      const uint32_t block = token / t.block_tokens;
      const uint32_t j = token % t.block_tokens;
      const uint32_t block_len = std::min(t.block_tokens, t.n_tokens - block * t.block_tokens);
      const uint64_t position = t.first_token + token;
      const auto page = static_cast<uint32_t>(t.page_table[position / g.page_tokens]);
      const auto slot = static_cast<uint32_t>(position % g.page_tokens);
      for (uint32_t layer = t.layer_first; layer < layer_end; ++layer) {
        for (uint32_t kv = 0; kv < 2; ++kv) {
          for (uint32_t head = 0; head < g.kv_heads; ++head) {
            for (uint32_t dim = 0; dim < g.head_dim; ++dim) {
              // Image: [layers][2][block_len][kv_heads][head_dim].
              const uint64_t image_index =
                  ((((uint64_t{layer} * 2 + kv) * block_len + j) * g.kv_heads + head) * g.head_dim +
                   dim);
              fn(element(layer, kv, page, slot, head, dim),
                 images[block].data() + image_index * g.elem_bytes, g.elem_bytes);
            }
          }
        }
      }
    }
  }

  KvCacheGeometry geometry_;
  std::vector<std::vector<uint8_t>> k_;
  std::vector<std::vector<uint8_t>> v_;
  std::vector<void*> k_ptrs_;
  std::vector<void*> v_ptrs_;
};

// Block images for a transfer, each filled with `fill` so untouched bytes are visible.
inline std::vector<std::vector<uint8_t>> make_images(const KvCacheGeometry& g,
                                                     const BlockTransfer& t, uint8_t fill) {
  std::vector<std::vector<uint8_t>> images;
  for (uint32_t done = 0; done < t.n_tokens; done += t.block_tokens) {
    images.emplace_back(image_bytes(g, std::min(t.block_tokens, t.n_tokens - done)), fill);
  }
  return images;
}

inline std::vector<void*> image_pointers(std::vector<std::vector<uint8_t>>& images) {
  std::vector<void*> ptrs;
  for (auto& image : images) ptrs.push_back(image.data());
  return ptrs;
}

// A page table of `len` distinct page ids in a seeded random (non-monotonic) order.
inline std::vector<int32_t> scattered_page_table(uint32_t len, uint32_t pages_total,
                                                 uint32_t seed) {
  std::vector<int32_t> ids(pages_total);
  for (uint32_t i = 0; i < pages_total; ++i) ids[i] = static_cast<int32_t>(i);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(len);
  return ids;
}

inline std::string geometry_name(KvLayout layout, KvFusion fusion, uint32_t elem_bytes) {
  return std::string(layout == KvLayout::nhd ? "Nhd" : "Hnd") +
         (fusion == KvFusion::fused ? "Fused" : "Separate") + "Elem" + std::to_string(elem_bytes);
}

}  // namespace kvpark::kernels::testing
