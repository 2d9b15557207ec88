// gather_scatter_cpu_test.cpp — the CPU path against the per-element reference.
//
// Model. Every case builds a random cache, runs the CPU kernel and the element loop on the
// same transfer, and compares whole images (gather) or whole tensors (scatter: equality of
// every tensor byte also proves nothing outside the range was written). The default transfer
// starts mid-page (token 5), uses blocks of 24 tokens over pages of 16 (a page size that does
// not divide the block), ends in a partial page and a partial block, and reads a scattered,
// non-monotonic page table.
#include <gtest/gtest.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "kv_test_cache.h"
#include "kvpark_kernels.h"

namespace kvpark::kernels {
namespace {

using testing::image_pointers;
using testing::make_images;
using testing::scattered_page_table;
using testing::TestCache;

constexpr uint8_t image_fill = 0xA5;  // marks image bytes a transfer did not write

struct Case {
  KvCacheGeometry geometry{.layers = 3,
                           .pages_total = 12,
                           .page_tokens = 16,
                           .kv_heads = 3,
                           .head_dim = 8,
                           .elem_bytes = 2};
  uint64_t first_token = 5;
  uint32_t n_tokens = 61;      // positions 5..65: logical pages 0..4, the last holds 2 tokens
  uint32_t block_tokens = 24;  // blocks of 24, 24, 13
  uint32_t layer_first = 0;
  uint32_t layer_count = layers_all;
  std::vector<int32_t> page_table;  // empty: scattered over pages_total
};

// Runs gather_cpu and the element loop on `c`; expects identical images.
void expect_gather_matches_reference(Case c, uint32_t seed = 1) {
  TestCache cache(c.geometry, seed);
  const uint32_t pages_used =
      static_cast<uint32_t>((c.first_token + c.n_tokens - 1) / c.geometry.page_tokens + 1);
  if (c.page_table.empty()) {
    c.page_table = scattered_page_table(pages_used, c.geometry.pages_total, seed);
  }
  BlockTransfer t{.page_table = c.page_table.data(),
                  .page_table_len = static_cast<uint32_t>(c.page_table.size()),
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens,
                  .layer_first = c.layer_first,
                  .layer_count = c.layer_count};
  auto images = make_images(c.geometry, t, image_fill);
  auto expected = make_images(c.geometry, t, image_fill);
  const auto ptrs = image_pointers(images);
  t.block_images = ptrs.data();
  ASSERT_EQ(gather_cpu(cache.cache(), t), KernelStatus::ok);
  cache.reference_gather(t, expected);
  ASSERT_EQ(images.size(), expected.size());
  for (size_t b = 0; b < images.size(); ++b) EXPECT_EQ(images[b], expected[b]) << "block " << b;
}

// Runs scatter_cpu and the element loop from the same random images; expects identical caches.
void expect_scatter_matches_reference(Case c, uint32_t seed = 2) {
  TestCache actual(c.geometry, seed);
  TestCache expected(c.geometry, seed);
  const uint32_t pages_used =
      static_cast<uint32_t>((c.first_token + c.n_tokens - 1) / c.geometry.page_tokens + 1);
  if (c.page_table.empty()) {
    c.page_table = scattered_page_table(pages_used, c.geometry.pages_total, seed);
  }
  BlockTransfer t{.page_table = c.page_table.data(),
                  .page_table_len = static_cast<uint32_t>(c.page_table.size()),
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens,
                  .layer_first = c.layer_first,
                  .layer_count = c.layer_count};
  auto images = make_images(c.geometry, t, 0);
  std::mt19937 rng(seed + 100);
  for (auto& image : images) {
    for (auto& b : image) b = static_cast<uint8_t>(rng());
  }
  const auto ptrs = image_pointers(images);
  t.block_images = ptrs.data();
  ASSERT_EQ(scatter_cpu(actual.cache(), t), KernelStatus::ok);
  expected.reference_scatter(t, images);
  EXPECT_EQ(actual.snapshot(), expected.snapshot());
}

using Param = std::tuple<KvLayout, KvFusion, uint32_t /*elem_bytes*/, uint32_t /*head_dim*/>;

class CpuMatrix : public ::testing::TestWithParam<Param> {
 protected:
  Case make_case() const {
    Case c;
    c.geometry.layout = std::get<0>(GetParam());
    c.geometry.fusion = std::get<1>(GetParam());
    c.geometry.elem_bytes = std::get<2>(GetParam());
    c.geometry.head_dim = std::get<3>(GetParam());
    return c;
  }
};

TEST_P(CpuMatrix, GatherMatchesElementLoop) {
  expect_gather_matches_reference(make_case());
}

TEST_P(CpuMatrix, ScatterMatchesElementLoop) {
  expect_scatter_matches_reference(make_case());
}

// Park from one page table, restore into a fresh cache through a different one, park again:
// the two image sets are bit-identical.
TEST_P(CpuMatrix, ParkRestoreRoundTripIsBitExact) {
  const Case c = make_case();
  TestCache source(c.geometry, 3);
  TestCache target(c.geometry, 4);
  const uint32_t pages_used = 5;
  const auto table_a = scattered_page_table(pages_used, c.geometry.pages_total, 5);
  const auto table_b = scattered_page_table(pages_used, c.geometry.pages_total, 6);
  BlockTransfer t{.page_table = table_a.data(),
                  .page_table_len = pages_used,
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens};
  auto parked = make_images(c.geometry, t, image_fill);
  auto reparked = make_images(c.geometry, t, 0);
  const auto parked_ptrs = image_pointers(parked);
  const auto reparked_ptrs = image_pointers(reparked);

  t.block_images = parked_ptrs.data();
  ASSERT_EQ(gather_cpu(source.cache(), t), KernelStatus::ok);
  t.page_table = table_b.data();
  ASSERT_EQ(scatter_cpu(target.cache(), t), KernelStatus::ok);
  t.block_images = reparked_ptrs.data();
  ASSERT_EQ(gather_cpu(target.cache(), t), KernelStatus::ok);
  EXPECT_EQ(parked, reparked);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, CpuMatrix,
                         ::testing::Combine(::testing::Values(KvLayout::nhd, KvLayout::hnd),
                                            ::testing::Values(KvFusion::separate, KvFusion::fused),
                                            ::testing::Values(1u, 2u, 4u),
                                            ::testing::Values(8u, 64u)),
                         [](const ::testing::TestParamInfo<Param>& param_info) {
                           return testing::geometry_name(std::get<0>(param_info.param),
                                                         std::get<1>(param_info.param),
                                                         std::get<2>(param_info.param)) +
                                  "HeadDim" + std::to_string(std::get<3>(param_info.param));
                         });

TEST(GatherCpu, MatchesElementLoopForRangeStartingMidPage) {
  Case c;
  c.first_token = 13;
  c.n_tokens = 40;
  expect_gather_matches_reference(c);
}

TEST(GatherCpu, MatchesElementLoopForPartialLastPage) {
  Case c;
  c.first_token = 0;
  c.n_tokens = 16 * 3 + 7;
  c.block_tokens = 16;
  expect_gather_matches_reference(c);
}

TEST(GatherCpu, MatchesElementLoopWhenPageSizeDoesNotDivideBlock) {
  Case c;
  c.first_token = 0;
  c.n_tokens = 80;
  c.block_tokens = 20;
  expect_gather_matches_reference(c);
}

TEST(GatherCpu, MatchesElementLoopForPagesLargerThanBlocks) {
  Case c;
  c.geometry.page_tokens = 64;
  c.first_token = 70;
  c.n_tokens = 100;
  c.block_tokens = 16;
  expect_gather_matches_reference(c);
}

TEST(GatherCpu, MatchesElementLoopForOneTokenPages) {
  Case c;
  c.geometry.page_tokens = 1;
  c.geometry.pages_total = 80;
  c.first_token = 3;
  c.n_tokens = 70;
  expect_gather_matches_reference(c);
}

TEST(GatherCpu, MatchesElementLoopForScatteredPageTableWithRepeats) {
  Case c;
  c.page_table = {7, 2, 7, 11, 0};  // non-monotonic, one page mapped twice (read-only use)
  expect_gather_matches_reference(c);
}

// Consecutive page ids make NHD runs adjacent; the merged copy must move the same bytes.
TEST(GatherCpu, MatchesElementLoopForAdjacentPagesInBothLayouts) {
  for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    Case c;
    c.geometry.layout = layout;
    c.page_table = {3, 4, 5, 6, 7};
    expect_gather_matches_reference(c);
    expect_scatter_matches_reference(c);
  }
}

TEST(GatherCpu, LayerSubrangeWritesOnlyThoseLayersSpans) {
  Case c;
  c.layer_first = 1;
  c.layer_count = 1;
  expect_gather_matches_reference(c);  // untouched spans keep image_fill in both
}

TEST(ScatterCpu, MatchesElementLoopForRangeStartingMidPageIntoPartialPages) {
  Case c;
  c.first_token = 21;
  c.n_tokens = 9;  // slots 5..13 of one page: both neighbours in the page stay untouched
  c.geometry.layout = KvLayout::hnd;
  expect_scatter_matches_reference(c);
}

// Restoring layer by layer (one call per layer) leaves the cache as one whole restore does.
TEST(ScatterCpu, LayerByLayerRestoreEqualsWholeRestore) {
  Case c;
  TestCache whole(c.geometry, 9);
  TestCache by_layer(c.geometry, 9);
  const auto table = scattered_page_table(5, c.geometry.pages_total, 10);
  BlockTransfer t{.page_table = table.data(),
                  .page_table_len = 5,
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens};
  auto images = make_images(c.geometry, t, 0);
  std::mt19937 rng(11);
  for (auto& image : images) {
    for (auto& b : image) b = static_cast<uint8_t>(rng());
  }
  const auto ptrs = image_pointers(images);
  t.block_images = ptrs.data();
  ASSERT_EQ(scatter_cpu(whole.cache(), t), KernelStatus::ok);
  for (uint32_t layer = 0; layer < c.geometry.layers; ++layer) {
    t.layer_first = layer;
    t.layer_count = 1;
    ASSERT_EQ(scatter_cpu(by_layer.cache(), t), KernelStatus::ok);
  }
  EXPECT_EQ(whole.snapshot(), by_layer.snapshot());
}

TEST(GatherCpu, BadPageIdFailsBeforeWritingAnyImage) {
  Case c;
  TestCache cache(c.geometry, 12);
  const std::vector<int32_t> table = {0, 1, 2, 3, 12};  // 12 == pages_total
  BlockTransfer t{.page_table = table.data(),
                  .page_table_len = 5,
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens};
  auto images = make_images(c.geometry, t, image_fill);
  const auto ptrs = image_pointers(images);
  t.block_images = ptrs.data();
  EXPECT_EQ(gather_cpu(cache.cache(), t), KernelStatus::bad_page_id);
  EXPECT_EQ(images, make_images(c.geometry, t, image_fill));
}

TEST(ScatterCpu, BadPageIdFailsBeforeWritingTheCache) {
  Case c;
  TestCache cache(c.geometry, 13);
  const auto before = cache.snapshot();
  const std::vector<int32_t> table = {0, 1, -1, 3, 4};
  BlockTransfer t{.page_table = table.data(),
                  .page_table_len = 5,
                  .first_token = c.first_token,
                  .n_tokens = c.n_tokens,
                  .block_tokens = c.block_tokens};
  auto images = make_images(c.geometry, t, image_fill);
  const auto ptrs = image_pointers(images);
  t.block_images = ptrs.data();
  EXPECT_EQ(scatter_cpu(cache.cache(), t), KernelStatus::bad_page_id);
  EXPECT_EQ(cache.snapshot(), before);
}

}  // namespace
}  // namespace kvpark::kernels
