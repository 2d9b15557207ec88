// gpu_bench.cpp — GPU part of kvpark-kernels-bench: restore and park bandwidth against the copy
// engine.
//
// Model. Block images live in page-aligned host memory registered with cuda_host_register (as
// the daemon's arena is). Restore = scatter_cuda from those images into a paged device cache;
// park = gather_cuda back into them. The baselines are cudaMemcpyAsync host-to-device and
// device-to-host of the same number of bytes between the same pinned buffer and one device
// buffer, in the same run. Times come from CUDA events around each call on one stream; each
// figure is the best of `reps` after one warm-up.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_cases.h"
#include "kvpark_kernels.h"
#include "kvpark_kernels_cuda.h"

namespace kvpark::bench {
namespace {

constexpr uint32_t gpu_tokens_default = 4096;  // 512 MiB of K+V per transfer
constexpr uint64_t host_page_bytes = 4096;

#define BENCH_CUDA(expr)                                                         \
  do {                                                                           \
    const cudaError_t bench_error_ = (expr);                                     \
    if (bench_error_ != cudaSuccess) {                                           \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(bench_error_)); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

// Best seconds of `reps` timed calls of fn(stream), after one untimed warm-up.
template <typename Fn>
double best_event_seconds(uint32_t reps, cudaStream_t stream, Fn fn) {
  cudaEvent_t start, stop;
  BENCH_CUDA(cudaEventCreate(&start));
  BENCH_CUDA(cudaEventCreate(&stop));
  fn();
  BENCH_CUDA(cudaStreamSynchronize(stream));
  float best_ms = 1e30f;
  for (uint32_t i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(start, stream));
    fn();
    BENCH_CUDA(cudaEventRecord(stop, stream));
    BENCH_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best_ms) best_ms = ms;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_ms / 1e3;
}

void check(kernels::KernelStatus status, int device_error, const char* what) {
  if (status == kernels::KernelStatus::ok) return;
  std::fprintf(stderr, "%s: %s (cuda error %d)\n", what, kernels::kernel_status_name(status),
               device_error);
  std::exit(1);
}

}  // namespace

int run_gpu_bench(uint32_t tokens, uint32_t reps) {
  if (tokens == 0) tokens = gpu_tokens_default;
  int count = 0;
  int device_error = 0;
  if (kernels::cuda_device_count(&count, &device_error) != kernels::KernelStatus::ok) {
    std::printf("GPU: skipped, no CUDA device (%s)\n",
                device_error != 0 ? cudaGetErrorString(static_cast<cudaError_t>(device_error))
                                  : "cudaGetDeviceCount returned 0");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const uint64_t bytes =
      uint64_t{tokens} * bench_layers * 2 * bench_kv_heads * bench_head_dim * bench_elem_bytes;
  const uint64_t host_bytes = (bytes + host_page_bytes - 1) / host_page_bytes * host_page_bytes;
  auto* host = static_cast<uint8_t*>(std::aligned_alloc(host_page_bytes, host_bytes));
  for (uint64_t i = 0; i < host_bytes; i += host_page_bytes) host[i] = static_cast<uint8_t>(i);
  void* host_device = nullptr;
  check(kernels::cuda_host_register(host, host_bytes, &host_device, &device_error), device_error,
        "cuda_host_register");
  void* device_buffer = nullptr;
  BENCH_CUDA(cudaMalloc(&device_buffer, bytes));

  const double h2d_s = best_event_seconds(reps, stream, [&] {
    BENCH_CUDA(cudaMemcpyAsync(device_buffer, host, bytes, cudaMemcpyHostToDevice, stream));
  });
  const double d2h_s = best_event_seconds(reps, stream, [&] {
    BENCH_CUDA(cudaMemcpyAsync(host, device_buffer, bytes, cudaMemcpyDeviceToHost, stream));
  });
  BENCH_CUDA(cudaFree(device_buffer));
  std::printf(
      "GPU: %s, %u tokens, %.1f MiB per transfer, images in registered host memory, "
      "best of %u\n",
      prop.name, tokens, static_cast<double>(bytes) / (1 << 20), reps);
  std::printf("cudaMemcpy pinned H2D: %.2f GB/s   D2H: %.2f GB/s\n",
              static_cast<double>(bytes) / h2d_s / 1e9, static_cast<double>(bytes) / d2h_s / 1e9);
  std::printf("%-16s %13s %9s %12s %9s\n", "layout/page", "restore GB/s", "vs H2D", "park GB/s",
              "vs D2H");

  for (const BenchLayout& layout : bench_layouts) {
    for (uint32_t page_tokens : bench_page_tokens) {
      const kernels::KvCacheGeometry g = bench_geometry(layout, page_tokens, tokens);
      const bool fused = layout.fusion == kernels::KvFusion::fused;
      const uint64_t half = uint64_t{g.pages_total} * page_tokens * kernels::image_row_bytes(g);
      std::vector<void*> k, v;
      for (uint32_t layer = 0; layer < bench_layers; ++layer) {
        void* p = nullptr;
        BENCH_CUDA(cudaMalloc(&p, fused ? 2 * half : half));
        k.push_back(p);
        if (!fused) {
          BENCH_CUDA(cudaMalloc(&p, half));
          v.push_back(p);
        }
      }
      const std::vector<int32_t> table = bench_page_table(g, bench_first_token, tokens);
      std::vector<void*> images;
      for (uint32_t done = 0; done < tokens; done += bench_block_tokens) {
        images.push_back(static_cast<uint8_t*>(host_device) + kernels::image_bytes(g, done));
      }
      int32_t* device_table = nullptr;
      void** device_images = nullptr;
      BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_table), table.size() * 4));
      BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&device_images), images.size() * 8));
      BENCH_CUDA(cudaMemcpy(device_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      BENCH_CUDA(
          cudaMemcpy(device_images, images.data(), images.size() * 8, cudaMemcpyHostToDevice));
      const kernels::PagedKvCache cache{
          .geometry = g, .k = k.data(), .v = fused ? nullptr : v.data()};
      const kernels::BlockTransfer transfer{.page_table = device_table,
                                            .page_table_len = static_cast<uint32_t>(table.size()),
                                            .first_token = bench_first_token,
                                            .n_tokens = tokens,
                                            .block_tokens = bench_block_tokens,
                                            .block_images = device_images};

      const double restore_s = best_event_seconds(reps, stream, [&] {
        check(kernels::scatter_cuda(cache, transfer, stream, &device_error), device_error,
              "scatter_cuda");
      });
      const double park_s = best_event_seconds(reps, stream, [&] {
        check(kernels::gather_cuda(cache, transfer, stream, &device_error), device_error,
              "gather_cuda");
      });
      std::printf("%-16s %13.2f %9.2f %12.2f %9.2f\n", layout_label(layout, page_tokens).c_str(),
                  static_cast<double>(bytes) / restore_s / 1e9, h2d_s / restore_s,
                  static_cast<double>(bytes) / park_s / 1e9, d2h_s / park_s);
      cudaFree(device_table);
      cudaFree(device_images);
      for (void* p : k) cudaFree(p);
      for (void* p : v) cudaFree(p);
    }
  }
  kernels::cuda_host_unregister(host);
  std::free(host);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace kvpark::bench
