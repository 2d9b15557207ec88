// gather_scatter_cuda_test.cpp — the CUDA path against the CPU path, bit-exact (suite 'gpu').
//
// Model. Each case builds one random host cache (kv_test_cache.h), uploads it to device
// tensors, and runs the same transfer through gather_cuda/scatter_cuda and gather_cpu/
// scatter_cpu. Images live in host memory registered with cuda_host_register (the zero-copy
// path the daemon's arena uses) unless a case says otherwise; the page table and the array of
// image device pointers live in device memory. Every test skips, with the reason, when no
// CUDA device is usable, and the program then exits 77.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kv_test_cache.h"
#include "kvpark_kernels.h"
#include "kvpark_kernels_cuda.h"

namespace kvpark::kernels {
namespace {

using testing::image_pointers;
using testing::make_images;
using testing::scattered_page_table;
using testing::TestCache;

#define ASSERT_CUDA(expr)                                                   \
  do {                                                                      \
    const cudaError_t cuda_error_ = (expr);                                 \
    ASSERT_EQ(cuda_error_, cudaSuccess) << cudaGetErrorString(cuda_error_); \
  } while (0)

// Skips the calling test when no device is usable; the reason names the runtime's answer.
#define SKIP_WITHOUT_GPU()                                                                \
  do {                                                                                    \
    int count_ = 0;                                                                       \
    int error_ = 0;                                                                       \
    if (cuda_device_count(&count_, &error_) != KernelStatus::ok) {                        \
      GTEST_SKIP() << "no CUDA device: "                                                  \
                   << (error_ != 0 ? cudaGetErrorString(static_cast<cudaError_t>(error_)) \
                                   : "cudaGetDeviceCount returned 0");                    \
    }                                                                                     \
  } while (0)

constexpr uint8_t image_fill = 0x5A;

// Device copies of a TestCache's tensors. `offset` shifts every tensor base by that many
// bytes, to exercise narrower vector widths.
class DeviceCache {
 public:
  DeviceCache(TestCache& host, uint32_t offset) : geometry_(host.geometry()), offset_(offset) {
    for (auto& t : host.k_tensors()) k_.push_back(upload(t));
    for (auto& t : host.v_tensors()) v_.push_back(upload(t));
  }
  ~DeviceCache() {
    for (void* p : allocations_) cudaFree(p);
  }
  PagedKvCache cache() const {
    return PagedKvCache{
        .geometry = geometry_, .k = k_.data(), .v = v_.empty() ? nullptr : v_.data()};
  }
  // Copies the device tensors back over the host cache's tensors.
  void download(TestCache& host) const {
    for (size_t i = 0; i < k_.size(); ++i) get(host.k_tensors()[i], k_[i]);
    for (size_t i = 0; i < v_.size(); ++i) get(host.v_tensors()[i], v_[i]);
  }

 private:
  void* upload(const std::vector<uint8_t>& bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes.size() + offset_), cudaSuccess);
    allocations_.push_back(p);
    void* base = static_cast<uint8_t*>(p) + offset_;
    EXPECT_EQ(cudaMemcpy(base, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return base;
  }
  static void get(std::vector<uint8_t>& bytes, void* device) {
    EXPECT_EQ(cudaMemcpy(bytes.data(), device, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

  KvCacheGeometry geometry_;
  uint32_t offset_;
  std::vector<void*> k_;
  std::vector<void*> v_;
  std::vector<void*> allocations_;
};

// A device-resident copy of a host array (page table, image pointer array).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&data_), host.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
};

// Block images in one page-aligned host buffer registered for mapped access (as the arena
// is): the vectors' contents are copied in, and copy_out() brings them back. `offset`
// misaligns each image start.
class MappedImages {
 public:
  MappedImages(const std::vector<std::vector<uint8_t>>& images, uint32_t offset) {
    constexpr uint64_t image_align_bytes = 256;
    uint64_t total = 0;
    for (const auto& image : images) {
      starts_.push_back(total + offset);
      sizes_.push_back(image.size());
      total = (total + offset + image.size() + image_align_bytes - 1) / image_align_bytes *
              image_align_bytes;
    }
    bytes_ = (total + host_page_bytes - 1) / host_page_bytes * host_page_bytes;
    buffer_ = static_cast<uint8_t*>(std::aligned_alloc(host_page_bytes, bytes_));
    for (size_t i = 0; i < images.size(); ++i) {
      std::memcpy(buffer_ + starts_[i], images[i].data(), sizes_[i]);
    }
    void* device = nullptr;
    EXPECT_EQ(cuda_host_register(buffer_, bytes_, &device), KernelStatus::ok);
    for (uint64_t start : starts_) device_ptrs_.push_back(static_cast<uint8_t*>(device) + start);
  }
  ~MappedImages() {
    cuda_host_unregister(buffer_);
    std::free(buffer_);
  }
  const std::vector<void*>& device_ptrs() const { return device_ptrs_; }
  void copy_out(std::vector<std::vector<uint8_t>>& images) const {
    for (size_t i = 0; i < images.size(); ++i) {
      std::memcpy(images[i].data(), buffer_ + starts_[i], sizes_[i]);
    }
  }

 private:
  static constexpr uint64_t host_page_bytes = 4096;
  uint8_t* buffer_ = nullptr;
  uint64_t bytes_ = 0;
  std::vector<uint64_t> starts_;
  std::vector<uint64_t> sizes_;
  std::vector<void*> device_ptrs_;
};

struct GpuCase {
  KvCacheGeometry geometry{.layers = 3,
                           .pages_total = 12,
                           .page_tokens = 16,
                           .kv_heads = 3,
                           .head_dim = 64,
                           .elem_bytes = 2};
  uint64_t first_token = 5;
  uint32_t n_tokens = 61;
  uint32_t block_tokens = 24;
  uint32_t layer_first = 0;
  uint32_t layer_count = layers_all;
  uint32_t cache_offset = 0;  // bytes added to every device tensor base
  uint32_t image_offset = 0;  // bytes added to every image start
};

BlockTransfer make_transfer(const GpuCase& c, const std::vector<int32_t>& table) {
  return BlockTransfer{.page_table = table.data(),
                       .page_table_len = static_cast<uint32_t>(table.size()),
                       .first_token = c.first_token,
                       .n_tokens = c.n_tokens,
                       .block_tokens = c.block_tokens,
                       .layer_first = c.layer_first,
                       .layer_count = c.layer_count};
}

std::vector<int32_t> table_for(const GpuCase& c, uint32_t seed) {
  const auto pages =
      static_cast<uint32_t>((c.first_token + c.n_tokens - 1) / c.geometry.page_tokens + 1);
  return scattered_page_table(pages, c.geometry.pages_total, seed);
}

void expect_gather_matches_cpu(const GpuCase& c) {
  TestCache host(c.geometry, 21);
  DeviceCache device(host, c.cache_offset);
  const auto table = table_for(c, 22);
  BlockTransfer t = make_transfer(c, table);
  auto expected = make_images(c.geometry, t, image_fill);
  const auto expected_ptrs = image_pointers(expected);
  t.block_images = expected_ptrs.data();
  ASSERT_EQ(gather_cpu(host.cache(), t), KernelStatus::ok);

  auto actual = make_images(c.geometry, t, image_fill);
  {
    MappedImages mapped(actual, c.image_offset);
    DeviceArray<int32_t> device_table(table);
    DeviceArray<void*> device_images(mapped.device_ptrs());
    t.page_table = device_table.get();
    t.block_images = device_images.get();
    int error = 0;
    ASSERT_EQ(gather_cuda(device.cache(), t, nullptr, &error), KernelStatus::ok) << error;
    ASSERT_CUDA(cudaDeviceSynchronize());
    mapped.copy_out(actual);
  }
  EXPECT_EQ(actual, expected);
}

void expect_scatter_matches_cpu(const GpuCase& c) {
  TestCache host(c.geometry, 31);
  DeviceCache device(host, c.cache_offset);
  const auto table = table_for(c, 32);
  BlockTransfer t = make_transfer(c, table);
  auto images = make_images(c.geometry, t, 0);
  std::mt19937 rng(33);
  for (auto& image : images) {
    for (auto& b : image) b = static_cast<uint8_t>(rng());
  }
  const auto host_ptrs = image_pointers(images);
  t.block_images = host_ptrs.data();
  {
    MappedImages mapped(images, c.image_offset);
    DeviceArray<int32_t> device_table(table);
    DeviceArray<void*> device_images(mapped.device_ptrs());
    BlockTransfer dt = t;
    dt.page_table = device_table.get();
    dt.block_images = device_images.get();
    int error = 0;
    ASSERT_EQ(scatter_cuda(device.cache(), dt, nullptr, &error), KernelStatus::ok) << error;
    ASSERT_CUDA(cudaDeviceSynchronize());
  }
  ASSERT_EQ(scatter_cpu(host.cache(), t), KernelStatus::ok);
  TestCache from_device(c.geometry, 31);
  device.download(from_device);
  EXPECT_EQ(from_device.snapshot(), host.snapshot());
}

using Param = std::tuple<KvLayout, KvFusion, uint32_t, uint32_t>;

class GpuMatrix : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  GpuCase make_case() const {
    GpuCase c;
    c.geometry.layout = std::get<0>(GetParam());
    c.geometry.fusion = std::get<1>(GetParam());
    c.geometry.elem_bytes = std::get<2>(GetParam());
    c.geometry.head_dim = std::get<3>(GetParam());
    return c;
  }
};

TEST_P(GpuMatrix, GatherMatchesCpu) {
  expect_gather_matches_cpu(make_case());
}
TEST_P(GpuMatrix, ScatterMatchesCpu) {
  expect_scatter_matches_cpu(make_case());
}

TEST_P(GpuMatrix, GatherMatchesCpuWithMisalignedImages) {
  GpuCase c = make_case();
  c.image_offset = 3;
  expect_gather_matches_cpu(c);
  expect_scatter_matches_cpu(c);
}

TEST_P(GpuMatrix, GatherMatchesCpuWithMisalignedCacheBases) {
  GpuCase c = make_case();
  c.cache_offset = c.geometry.elem_bytes;  // element-aligned only: narrow vectors
  expect_gather_matches_cpu(c);
  expect_scatter_matches_cpu(c);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, GpuMatrix,
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

TEST(GatherCuda, MatchesCpuForRealisticGeometry) {
  SKIP_WITHOUT_GPU();
  for (KvLayout layout : {KvLayout::nhd, KvLayout::hnd}) {
    GpuCase c;
    c.geometry = {.layers = 32,
                  .pages_total = 64,
                  .page_tokens = 16,
                  .kv_heads = 8,
                  .head_dim = 128,
                  .elem_bytes = 2,
                  .layout = layout};
    c.first_token = 0;
    c.n_tokens = 512;
    c.block_tokens = 64;
    expect_gather_matches_cpu(c);
    expect_scatter_matches_cpu(c);
  }
}

TEST(ScatterCuda, LayerSubrangeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.layer_first = 1;
  c.layer_count = 1;
  expect_gather_matches_cpu(c);
  expect_scatter_matches_cpu(c);
}

TEST(GatherCuda, RangeStartingMidPageInLargePagesMatchesCpu) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.geometry.page_tokens = 64;
  c.first_token = 70;
  c.n_tokens = 100;
  c.block_tokens = 16;
  expect_gather_matches_cpu(c);
  expect_scatter_matches_cpu(c);
}

// The device cannot report a bad page id, so it must skip it: rows of that page stay as they
// were and nothing outside the tensors is written.
TEST(GatherCuda, SkipsOutOfRangePageIds) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  c.first_token = 0;
  c.n_tokens = 32;
  c.block_tokens = 32;
  TestCache host(c.geometry, 41);
  DeviceCache device(host, 0);
  const std::vector<int32_t> table = {3, static_cast<int32_t>(c.geometry.pages_total)};
  BlockTransfer t = make_transfer(c, table);
  auto images = make_images(c.geometry, t, image_fill);
  {
    MappedImages mapped(images, 0);
    DeviceArray<int32_t> device_table(table);
    DeviceArray<void*> device_images(mapped.device_ptrs());
    t.page_table = device_table.get();
    t.block_images = device_images.get();
    ASSERT_EQ(gather_cuda(device.cache(), t, nullptr), KernelStatus::ok);
    ASSERT_CUDA(cudaDeviceSynchronize());
    mapped.copy_out(images);
  }
  const uint64_t row = image_row_bytes(c.geometry);
  for (uint32_t layer = 0; layer < c.geometry.layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      const uint64_t span = image_span_offset(c.geometry, 32, layer, kv);
      for (uint64_t b = span + 16 * row; b < span + 32 * row; ++b) {
        ASSERT_EQ(images[0][b], image_fill) << "layer " << layer << " kv " << kv;
      }
    }
  }
}

TEST(GatherCuda, RejectsBadDescriptorBeforeLaunching) {
  SKIP_WITHOUT_GPU();
  GpuCase c;
  TestCache host(c.geometry, 51);
  DeviceCache device(host, 0);
  const auto table = table_for(c, 52);
  BlockTransfer t = make_transfer(c, table);
  t.n_tokens = 0;
  void* images[1] = {nullptr};
  t.block_images = images;
  EXPECT_EQ(gather_cuda(device.cache(), t, nullptr), KernelStatus::bad_range);
}

}  // namespace
}  // namespace kvpark::kernels

// Runs every test (each skips with its reason without a device), then exits 77 in that case so
// meson reports the suite as skipped rather than passed.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  int count = 0;
  const bool have_device =
      kvpark::kernels::cuda_device_count(&count) == kvpark::kernels::KernelStatus::ok;
  return rc == 0 && !have_device ? 77 : rc;
}
