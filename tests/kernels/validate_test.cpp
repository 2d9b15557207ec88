// validate_test.cpp — descriptor validation: each limit at N and N+1, each status reachable.
//
// Model. Validation reads only the descriptor (validate_geometry, validate_transfer) or also
// the host arrays (validate_transfer_arrays); none of these tests touches tensor bytes, so the
// cache pointers only need to be non-null.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvpark_kernels.h"
#include "kvpark_kernels_cuda.h"

namespace kvpark::kernels {
namespace {

constexpr KvCacheGeometry good_geometry{.layers = 4,
                                        .pages_total = 8,
                                        .page_tokens = 16,
                                        .kv_heads = 2,
                                        .head_dim = 64,
                                        .elem_bytes = 2};

// A well-formed separate-K/V transfer of tokens [5, 45) over 3 pages, blocks of 32.
struct Fixture {
  uint8_t dummy = 0;
  std::vector<void*> layer_ptrs = std::vector<void*>(layers_max + 1, &dummy);
  std::vector<int32_t> page_table = {4, 1, 6};
  std::vector<void*> images = {&dummy, &dummy};
  PagedKvCache cache{.geometry = good_geometry, .k = layer_ptrs.data(), .v = layer_ptrs.data()};
  BlockTransfer transfer{.page_table = page_table.data(),
                         .page_table_len = 3,
                         .first_token = 5,
                         .n_tokens = 40,
                         .block_tokens = 32,
                         .block_images = images.data()};
  KernelStatus check() const { return validate_transfer(cache, transfer); }
  KernelStatus check_arrays() const { return validate_transfer_arrays(cache, transfer); }
};

TEST(ValidateTransfer, AcceptsWellFormedTransfer) {
  Fixture f;
  EXPECT_EQ(f.check(), KernelStatus::ok);
  EXPECT_EQ(f.check_arrays(), KernelStatus::ok);
}

TEST(ValidateGeometry, RejectsEachZeroDimension) {
  uint32_t KvCacheGeometry::*fields[] = {
      &KvCacheGeometry::layers,   &KvCacheGeometry::pages_total, &KvCacheGeometry::page_tokens,
      &KvCacheGeometry::kv_heads, &KvCacheGeometry::head_dim,    &KvCacheGeometry::elem_bytes};
  for (auto field : fields) {
    KvCacheGeometry g = good_geometry;
    g.*field = 0;
    EXPECT_EQ(validate_geometry(g), KernelStatus::bad_geometry);
  }
}

TEST(ValidateGeometry, AcceptsElemBytesOneTwoFourOnly) {
  for (uint32_t e = 0; e <= 8; ++e) {
    KvCacheGeometry g = good_geometry;
    g.elem_bytes = e;
    const bool valid = e == 1 || e == 2 || e == 4;
    EXPECT_EQ(validate_geometry(g), valid ? KernelStatus::ok : KernelStatus::bad_geometry) << e;
  }
}

TEST(ValidateGeometry, AcceptsEachLimitAndRejectsOneMore) {
  struct Limit {
    uint32_t KvCacheGeometry::*field;
    uint32_t max;
  };
  const Limit limits[] = {{&KvCacheGeometry::layers, layers_max},
                          {&KvCacheGeometry::page_tokens, page_tokens_max},
                          {&KvCacheGeometry::kv_heads, kv_heads_max},
                          {&KvCacheGeometry::head_dim, head_dim_max}};
  for (const Limit& limit : limits) {
    KvCacheGeometry g = good_geometry;
    g.*limit.field = limit.max;
    EXPECT_EQ(validate_geometry(g), KernelStatus::ok) << limit.max;
    g.*limit.field = limit.max + 1;
    EXPECT_EQ(validate_geometry(g), KernelStatus::bad_geometry) << limit.max;
  }
}

TEST(ValidateGeometry, RejectsTensorSizeOverflow) {
  KvCacheGeometry g{.layers = 1,
                    .pages_total = pages_total_max,
                    .page_tokens = page_tokens_max,
                    .kv_heads = kv_heads_max,
                    .head_dim = head_dim_max,
                    .elem_bytes = 4,
                    .fusion = KvFusion::fused};
  EXPECT_EQ(validate_geometry(g), KernelStatus::bad_geometry);
  g.pages_total = 1;
  EXPECT_EQ(validate_geometry(g), KernelStatus::ok);
}

TEST(ValidateGeometry, RejectsOutOfRangeEnums) {
  KvCacheGeometry g = good_geometry;
  g.layout = static_cast<KvLayout>(7);
  EXPECT_EQ(validate_geometry(g), KernelStatus::bad_geometry);
  g = good_geometry;
  g.fusion = static_cast<KvFusion>(7);
  EXPECT_EQ(validate_geometry(g), KernelStatus::bad_geometry);
}

TEST(ValidateTransfer, RejectsEmptyRangeAsBadRange) {
  Fixture f;
  f.transfer.n_tokens = 0;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
}

TEST(ValidateTransfer, AcceptsTransferTokensMaxAndRejectsOneMore) {
  Fixture f;
  f.cache.geometry.page_tokens = page_tokens_max;
  f.transfer.first_token = 0;
  f.transfer.block_tokens = transfer_tokens_max;
  std::vector<int32_t> table(transfer_tokens_max / page_tokens_max + 1, 0);
  f.transfer.page_table = table.data();
  f.transfer.page_table_len = static_cast<uint32_t>(table.size());
  f.transfer.n_tokens = transfer_tokens_max;
  EXPECT_EQ(f.check(), KernelStatus::ok);
  f.transfer.n_tokens = transfer_tokens_max + 1;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
}

TEST(ValidateTransfer, RejectsZeroBlockTokens) {
  Fixture f;
  f.transfer.block_tokens = 0;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
}

TEST(ValidateTransfer, RejectsPageTableOneShortOfTheRange) {
  Fixture f;  // last token 44 lives in logical page 2: three entries needed
  f.transfer.page_table_len = 2;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
  f.transfer.first_token = 4;  // last token 43: still page 2
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
  f.transfer.first_token = 0;  // last token 39: page 2 as well
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
  f.transfer.n_tokens = 32;  // last token 31: page 1, two entries suffice
  EXPECT_EQ(f.check(), KernelStatus::ok);
}

TEST(ValidateTransfer, RejectsTokenPositionOverflow) {
  Fixture f;
  f.transfer.first_token = UINT64_MAX - 10;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
}

TEST(ValidateTransfer, RejectsLayerSubrangePastLastLayer) {
  Fixture f;
  f.transfer.layer_first = 3;
  f.transfer.layer_count = 1;
  EXPECT_EQ(f.check(), KernelStatus::ok);
  f.transfer.layer_count = 2;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
  f.transfer.layer_first = 4;
  f.transfer.layer_count = layers_all;
  EXPECT_EQ(f.check(), KernelStatus::bad_range);
}

TEST(ValidateTransfer, RejectsNullPointers) {
  {
    Fixture f;
    f.cache.k = nullptr;
    EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
  }
  {
    Fixture f;
    f.transfer.page_table = nullptr;
    EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
  }
  {
    Fixture f;
    f.transfer.block_images = nullptr;
    EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
  }
  {
    Fixture f;
    f.layer_ptrs[2] = nullptr;
    EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
    f.transfer.layer_count = 2;  // layers 0..1 only: layer 2 is not read
    EXPECT_EQ(f.check(), KernelStatus::ok);
  }
}

TEST(ValidateTransfer, RejectsVForFusedAndMissingVForSeparate) {
  Fixture f;
  f.cache.geometry.fusion = KvFusion::fused;
  EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
  f.cache.v = nullptr;
  EXPECT_EQ(f.check(), KernelStatus::ok);
  f.cache.geometry.fusion = KvFusion::separate;
  EXPECT_EQ(f.check(), KernelStatus::bad_pointer);
}

TEST(ValidateTransferArrays, AcceptsLastPageIdAndRejectsPagesTotal) {
  Fixture f;
  f.page_table[1] = static_cast<int32_t>(good_geometry.pages_total - 1);
  EXPECT_EQ(f.check_arrays(), KernelStatus::ok);
  f.page_table[1] = static_cast<int32_t>(good_geometry.pages_total);
  EXPECT_EQ(f.check_arrays(), KernelStatus::bad_page_id);
}

TEST(ValidateTransferArrays, RejectsNegativePageId) {
  Fixture f;
  f.page_table[2] = -1;
  EXPECT_EQ(f.check_arrays(), KernelStatus::bad_page_id);
}

TEST(ValidateTransferArrays, IgnoresPageIdsOutsideTheRange) {
  Fixture f;
  f.page_table.push_back(-5);  // logical page 3: past the range
  f.transfer.page_table = f.page_table.data();
  f.transfer.page_table_len = 4;
  EXPECT_EQ(f.check_arrays(), KernelStatus::ok);
  f.page_table[0] = -5;
  f.transfer.first_token = 16;  // range starts in logical page 1
  f.transfer.n_tokens = 29;
  EXPECT_EQ(f.check_arrays(), KernelStatus::ok);
}

TEST(ValidateTransferArrays, RejectsNullBlockImage) {
  Fixture f;
  f.images[1] = nullptr;
  EXPECT_EQ(f.check_arrays(), KernelStatus::bad_pointer);
}

TEST(ImageFormat, SpansAreLayerMajorKThenV) {
  const uint32_t tokens = 24;
  const uint64_t row = image_row_bytes(good_geometry);
  EXPECT_EQ(row, 2u * 64 * 2);
  EXPECT_EQ(image_bytes(good_geometry, tokens), 4u * 2 * tokens * row);
  EXPECT_EQ(image_span_offset(good_geometry, tokens, 0, 0), 0u);
  EXPECT_EQ(image_span_offset(good_geometry, tokens, 0, 1), tokens * row);
  EXPECT_EQ(image_span_offset(good_geometry, tokens, 3, 1), 7u * tokens * row);
}

TEST(KernelStatusName, NamesEveryStatus) {
  EXPECT_STREQ(kernel_status_name(KernelStatus::ok), "ok");
  EXPECT_STREQ(kernel_status_name(KernelStatus::bad_geometry), "bad_geometry");
  EXPECT_STREQ(kernel_status_name(KernelStatus::bad_range), "bad_range");
  EXPECT_STREQ(kernel_status_name(KernelStatus::bad_page_id), "bad_page_id");
  EXPECT_STREQ(kernel_status_name(KernelStatus::bad_pointer), "bad_pointer");
  EXPECT_STREQ(kernel_status_name(KernelStatus::device_unavailable), "device_unavailable");
  EXPECT_STREQ(kernel_status_name(KernelStatus::device_error), "device_error");
}

TEST(CudaEntryPoints, ReportDeviceUnavailableWhenBuiltWithoutCuda) {
  if (cuda_built()) GTEST_SKIP() << "built with CUDA; covered by the gpu suite";
  Fixture f;
  int count = -1;
  EXPECT_EQ(cuda_device_count(&count), KernelStatus::device_unavailable);
  EXPECT_EQ(count, -1);
  EXPECT_EQ(gather_cuda(f.cache, f.transfer, nullptr), KernelStatus::device_unavailable);
  EXPECT_EQ(scatter_cuda(f.cache, f.transfer, nullptr), KernelStatus::device_unavailable);
}

}  // namespace
}  // namespace kvpark::kernels
