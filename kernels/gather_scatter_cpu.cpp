// gather_scatter_cpu.cpp — CPU gather/scatter: the reference semantics and the CPU engine path.
//
// Model. The range is walked as (block, layer, kv, page segment), where a page segment is the
// run of tokens of one block that lie in one page. Within a segment:
//   nhd: the tokens' rows are contiguous in the cache and in the image -> one memcpy, merged
//        with the previous segment's when the pages are physically adjacent;
//   hnd: each (token, head) unit of D*E bytes is contiguous on both sides -> one fixed-size
//        copy per unit, specialised for common unit sizes so it compiles to vector moves.
// Image writes (gather) and reads (scatter) are sequential within each block image.
// Invariant: only bytes of the range are read or written; validation happens before any copy.
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kvpark_kernels.h"
#include "transfer_plan.h"

namespace kvpark::kernels {

namespace {

// Gather copies cache -> image; scatter copies image -> cache.
template <bool kGather>
inline void copy_bytes(uint8_t* cache, uint8_t* image, size_t bytes) {
  if constexpr (kGather) {
    std::memcpy(image, cache, bytes);
  } else {
    std::memcpy(cache, image, bytes);
  }
}

// Merges copies whose cache and image ranges both continue the previous one.
template <bool kGather>
class RunCoalescer {
 public:
  void add(uint8_t* cache, uint8_t* image, size_t bytes) {
    if (bytes_ != 0 && cache == cache_ + bytes_ && image == image_ + bytes_) {
      bytes_ += bytes;
      return;
    }
    flush();
    cache_ = cache;
    image_ = image;
    bytes_ = bytes;
  }
  void flush() {
    if (bytes_ != 0) copy_bytes<kGather>(cache_, image_, bytes_);
    bytes_ = 0;
  }

 private:
  uint8_t* cache_ = nullptr;
  uint8_t* image_ = nullptr;
  size_t bytes_ = 0;
};

// Where one (block, layer, kv) span lives: its cache tensor and image span.
struct Span {
  uint8_t* cache_base;   // K or V base of the layer (fused V: base + v_offset)
  uint8_t* image;        // first row of the span in the block image
  uint64_t token_first;  // sequence position of the block's first token
  uint32_t tokens;       // tokens in the block
};

// A unit size of kUnitBytes, or any size when kUnitBytes == 0.
template <bool kGather, size_t kUnitBytes>
void copy_span_hnd(const TransferPlan& plan, const KvCacheGeometry& g, const int32_t* page_table,
                   const Span& span) {
  const size_t unit_bytes = kUnitBytes != 0 ? kUnitBytes : plan.unit_bytes;
  uint8_t* image_row = span.image;
  uint32_t done = 0;
  while (done < span.tokens) {
    const uint64_t position = span.token_first + done;
    const uint32_t slot_first = static_cast<uint32_t>(position % g.page_tokens);
    const int32_t page = page_table[position / g.page_tokens];
    assert(page >= 0 && static_cast<uint32_t>(page) < g.pages_total);
    uint8_t* page_base = span.cache_base + static_cast<uint64_t>(page) * plan.page_stride;
    const uint32_t seg_tokens = std::min(g.page_tokens - slot_first, span.tokens - done);
    for (uint32_t slot = slot_first; slot < slot_first + seg_tokens; ++slot) {
      uint8_t* cache_unit = page_base + slot * plan.slot_stride;
      uint8_t* image_unit = image_row;
      for (uint32_t head = 0; head < g.kv_heads; ++head) {
        copy_bytes<kGather>(cache_unit, image_unit, unit_bytes);
        cache_unit += plan.head_stride;
        image_unit += unit_bytes;
      }
      image_row += plan.row_bytes;
    }
    done += seg_tokens;
  }
}

template <bool kGather>
void copy_span_nhd(const TransferPlan& plan, const KvCacheGeometry& g, const int32_t* page_table,
                   const Span& span) {
  RunCoalescer<kGather> runs;
  uint8_t* image_row = span.image;
  uint32_t done = 0;
  while (done < span.tokens) {
    const uint64_t position = span.token_first + done;
    const uint32_t slot_first = static_cast<uint32_t>(position % g.page_tokens);
    const int32_t page = page_table[position / g.page_tokens];
    assert(page >= 0 && static_cast<uint32_t>(page) < g.pages_total);
    const uint32_t seg_tokens = std::min(g.page_tokens - slot_first, span.tokens - done);
    uint8_t* cache_row = span.cache_base + static_cast<uint64_t>(page) * plan.page_stride +
                         slot_first * plan.slot_stride;
    runs.add(cache_row, image_row, seg_tokens * plan.row_bytes);
    image_row += seg_tokens * plan.row_bytes;
    done += seg_tokens;
  }
  runs.flush();
}

using SpanCopy = void (*)(const TransferPlan&, const KvCacheGeometry&, const int32_t*, const Span&);

template <bool kGather>
SpanCopy pick_span_copy(const TransferPlan& plan, KvLayout layout) {
  if (layout == KvLayout::nhd) return &copy_span_nhd<kGather>;
  switch (plan.unit_bytes) {
    case 16:
      return &copy_span_hnd<kGather, 16>;
    case 32:
      return &copy_span_hnd<kGather, 32>;
    case 64:
      return &copy_span_hnd<kGather, 64>;
    case 128:
      return &copy_span_hnd<kGather, 128>;
    case 256:
      return &copy_span_hnd<kGather, 256>;
    case 512:
      return &copy_span_hnd<kGather, 512>;
    case 1024:
      return &copy_span_hnd<kGather, 1024>;
    default:
      return &copy_span_hnd<kGather, 0>;
  }
}

template <bool kGather>
KernelStatus transfer_cpu(const PagedKvCache& cache, const BlockTransfer& t) {
  if (KernelStatus status = validate_transfer_arrays(cache, t); status != KernelStatus::ok) {
    return status;
  }
  const KvCacheGeometry& g = cache.geometry;
  const TransferPlan plan = make_transfer_plan(g);
  const SpanCopy copy_span = pick_span_copy<kGather>(plan, g.layout);
  const uint32_t layer_end = t.layer_first + transfer_layer_count(g, t);

  for (uint32_t block = 0, done = 0; done < t.n_tokens; ++block) {
    const uint32_t tokens = std::min(t.block_tokens, t.n_tokens - done);
    auto* image = static_cast<uint8_t*>(t.block_images[block]);
    for (uint32_t layer = t.layer_first; layer < layer_end; ++layer) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        uint8_t* base =
            static_cast<uint8_t*>(kv == 0 || plan.fused ? cache.k[layer] : cache.v[layer]);
        if (kv == 1) base += plan.v_offset;
        const Span span{
            .cache_base = base,
            .image = image + image_span_offset(g, tokens, layer, kv),
            .token_first = t.first_token + done,
            .tokens = tokens,
        };
        copy_span(plan, g, t.page_table, span);
      }
    }
    done += tokens;
  }
  return KernelStatus::ok;
}

}  // namespace

KernelStatus gather_cpu(const PagedKvCache& cache, const BlockTransfer& transfer) {
  return transfer_cpu<true>(cache, transfer);
}

KernelStatus scatter_cpu(const PagedKvCache& cache, const BlockTransfer& transfer) {
  return transfer_cpu<false>(cache, transfer);
}

}  // namespace kvpark::kernels
