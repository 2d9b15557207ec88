// kernels_bench.cpp — kvpark-kernels-bench: gather/scatter throughput against memcpy.
//
// Model. For each layout and page size (bench_cases.h) the CPU part times gather_cpu (park)
// and scatter_cpu (restore) of one transfer and a plain memcpy of the same number of bytes
// between two buffers of the same size, in the same run, and prints throughput as a ratio to
// that memcpy. The three are timed in alternation and each figure is the best of `reps`
// runs, so a shared machine's load hits all of them alike; buffers are far larger than the
// last-level cache and touched beforehand. With CUDA built in, the GPU part follows
// (gpu_bench.cpp).
//
// Usage: kvpark-kernels-bench [--cpu|--gpu] [--tokens N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_cases.h"
#include "kvpark_kernels.h"
#include "proto/version.h"

namespace kvpark::bench {
namespace {

constexpr uint32_t cpu_tokens_default = 512;  // 64 MiB of K+V per transfer
constexpr uint32_t reps_default = 7;

using Clock = std::chrono::steady_clock;

struct CpuFixture {
  kernels::KvCacheGeometry geometry;
  std::vector<std::vector<uint8_t>> tensors;  // K then V per layer, or KV per layer
  std::vector<void*> k, v;
  std::vector<int32_t> page_table;
  std::vector<uint8_t> images;  // all block images back to back
  std::vector<void*> image_ptrs;
  kernels::PagedKvCache cache;
  kernels::BlockTransfer transfer;
};

void make_fixture(CpuFixture& f, const BenchLayout& layout, uint32_t page_tokens, uint32_t tokens) {
  f.geometry = bench_geometry(layout, page_tokens, tokens);
  const bool fused = layout.fusion == kernels::KvFusion::fused;
  const uint64_t half =
      uint64_t{f.geometry.pages_total} * page_tokens * kernels::image_row_bytes(f.geometry);
  for (uint32_t layer = 0; layer < bench_layers; ++layer) {
    f.tensors.emplace_back(fused ? 2 * half : half, uint8_t{1});
    f.k.push_back(f.tensors.back().data());
    if (!fused) {
      f.tensors.emplace_back(half, uint8_t{2});
      f.v.push_back(f.tensors.back().data());
    }
  }
  f.page_table = bench_page_table(f.geometry, bench_first_token, tokens);
  f.images.assign(kernels::image_bytes(f.geometry, tokens), uint8_t{3});
  for (uint32_t done = 0; done < tokens; done += bench_block_tokens) {
    f.image_ptrs.push_back(f.images.data() + kernels::image_bytes(f.geometry, done));
  }
  f.cache = {.geometry = f.geometry, .k = f.k.data(), .v = fused ? nullptr : f.v.data()};
  f.transfer = {.page_table = f.page_table.data(),
                .page_table_len = static_cast<uint32_t>(f.page_table.size()),
                .first_token = bench_first_token,
                .n_tokens = tokens,
                .block_tokens = bench_block_tokens,
                .block_images = f.image_ptrs.data()};
}

// Seconds of one call.
template <typename Fn>
double seconds(Fn fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int run_cpu_bench(uint32_t tokens, uint32_t reps) {
  const uint64_t bytes =
      uint64_t{tokens} * bench_layers * 2 * bench_kv_heads * bench_head_dim * bench_elem_bytes;
  std::vector<uint8_t> src(bytes, uint8_t{4});
  std::vector<uint8_t> dst(bytes, uint8_t{5});
  std::printf(
      "CPU: %u tokens, %u layers x %u kv_heads x %u head_dim x %u B, blocks of %u, "
      "%.1f MiB per transfer, scattered page table, best of %u interleaved runs\n",
      tokens, bench_layers, bench_kv_heads, bench_head_dim, bench_elem_bytes, bench_block_tokens,
      static_cast<double>(bytes) / (1 << 20), reps);
  std::printf("%-16s %12s %12s %8s %12s %8s\n", "layout/page", "memcpy GB/s", "gather GB/s",
              "ratio", "scatter GB/s", "ratio");
  double ratio_min = 1e30;
  for (const BenchLayout& layout : bench_layouts) {
    for (uint32_t page_tokens : bench_page_tokens) {
      CpuFixture f;
      make_fixture(f, layout, page_tokens, tokens);
      // memcpy, gather and scatter alternate, so all three see the same machine load.
      double memcpy_s = 1e30, gather_s = 1e30, scatter_s = 1e30;
      for (uint32_t i = 0; i < reps; ++i) {
        memcpy_s = std::min(memcpy_s, seconds([&] { std::memcpy(dst.data(), src.data(), bytes); }));
        kernels::KernelStatus gather_status = kernels::KernelStatus::ok;
        kernels::KernelStatus scatter_status = kernels::KernelStatus::ok;
        gather_s = std::min(
            gather_s, seconds([&] { gather_status = kernels::gather_cpu(f.cache, f.transfer); }));
        scatter_s =
            std::min(scatter_s,
                     seconds([&] { scatter_status = kernels::scatter_cpu(f.cache, f.transfer); }));
        if (gather_status != kernels::KernelStatus::ok ||
            scatter_status != kernels::KernelStatus::ok) {
          std::fprintf(stderr, "gather_cpu: %s, scatter_cpu: %s\n",
                       kernels::kernel_status_name(gather_status),
                       kernels::kernel_status_name(scatter_status));
          return 1;
        }
      }
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf("%-16s %12.2f %12.2f %8.2f %12.2f %8.2f\n",
                  layout_label(layout, page_tokens).c_str(), gb / memcpy_s, gb / gather_s,
                  memcpy_s / gather_s, gb / scatter_s, memcpy_s / scatter_s);
      ratio_min = std::min({ratio_min, memcpy_s / gather_s, memcpy_s / scatter_s});
    }
  }
  std::printf("lowest ratio to memcpy: %.2f\n", ratio_min);
  return 0;
}

}  // namespace
}  // namespace kvpark::bench

int main(int argc, char** argv) {
  bool cpu = true;
  bool gpu = true;
  uint32_t tokens = 0;
  uint32_t reps = kvpark::bench::reps_default;
  const char* usage_text =
      "Usage: kvpark-kernels-bench [--cpu|--gpu] [--tokens N] [--reps N]\n"
      "Measures paged-KV gather/scatter, CPU reference and CUDA.\n\n"
      "  --cpu | --gpu   only that implementation\n"
      "  --tokens N      tokens per run (a multiple of the block size)\n"
      "  --reps N        repetitions\n"
      "  -h, --help      this help\n"
      "      --version   the version\n";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage_text, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("kvpark-kernels-bench %s\n", kvpark::version);
      return 0;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cpu") {
      gpu = false;
    } else if (arg == "--gpu") {
      cpu = false;
    } else if (arg == "--tokens" && i + 1 < argc) {
      tokens = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr, "kvpark-kernels-bench: unknown option %s\n%s", arg.c_str(), usage_text);
      return 2;
    }
  }
  if (reps == 0 || (tokens != 0 && tokens % kvpark::bench::bench_block_tokens != 0)) {
    std::fprintf(stderr, "reps must be > 0 and tokens a multiple of %u\n",
                 kvpark::bench::bench_block_tokens);
    return 2;
  }
  int rc = 0;
  if (cpu) {
    rc = kvpark::bench::run_cpu_bench(tokens != 0 ? tokens : kvpark::bench::cpu_tokens_default,
                                      reps);
  }
#ifdef KVPARK_KERNELS_CUDA
  if (gpu && rc == 0) rc = kvpark::bench::run_gpu_bench(tokens, reps);
#else
  if (gpu && !cpu) {
    std::printf("GPU: not built (configure with -Dcuda=enabled and nvcc available)\n");
  }
#endif
  return rc;
}
