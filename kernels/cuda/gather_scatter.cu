// gather_scatter.cu — CUDA gather/scatter: one launch per transfer, all layers.
//
// Model. The transfer is a set of image *rows*: (layer, kv, token), each row_bytes long and
// made of units_per_row units that are contiguous in the cache (transfer_plan.h). A CTA is a
// 2-D block: threadIdx.y picks a row, threadIdx.x strides over the row's vectors, so a warp's
// stores to an image row are consecutive 16-byte vectors (full write-combined transactions
// over the bus when the image is mapped host memory). Rows are indexed token-fastest, so
// neighbouring CTAs write neighbouring rows of the same block image. The vector width is the
// widest that every cache stride and base allows (chosen on the host); a row whose image
// address breaks it is copied bytewise. Page ids outside [0, pages_total) are skipped.
// Invariant: same bytes, same places as the CPU path (gather_scatter_cpu.cpp).
#include <cuda_runtime.h>

#include <cstdint>

#include "../kvpark_kernels.h"
#include "../kvpark_kernels_cuda.h"
#include "../transfer_plan.h"

namespace kvpark::kernels {

namespace {

constexpr uint32_t cta_threads = 256;         // threads per CTA (rows_per_cta * row_threads)
constexpr uint32_t grid_ctas_max = 1u << 20;  // CTAs per launch; more rows are grid-strided
constexpr uint64_t vector_bytes_max = 16;     // widest copy: one uint4

struct LaunchParams {
  TransferPlan plan;
  uint8_t* k[layers_max];  // K base per layer, device addresses
  uint8_t* v[layers_max];  // V base per layer (fused: K base + v_offset)
  const int32_t* page_table;
  void* const* block_images;
  uint64_t first_token;
  uint32_t n_tokens;
  uint32_t block_tokens;
  uint32_t layer_first;
  uint32_t rows;  // layer_count * 2 * n_tokens
  uint32_t page_tokens;
  uint32_t pages_total;
  uint32_t vecs_per_row;   // row_bytes / vector width
  uint32_t vecs_per_unit;  // unit_bytes / vector width
};
// Kernel parameters must fit the 4 KiB limit every supported architecture accepts.
static_assert(sizeof(LaunchParams) <= 4000, "layers_max too large for a by-value launch");

template <bool kGather, typename T>
__device__ __forceinline__ void move(T* cache, T* image) {
  if constexpr (kGather) {
    *image = *cache;
  } else {
    *cache = *image;
  }
}

template <bool kGather, typename Vec>
__global__ void __launch_bounds__(cta_threads)
    transfer_kernel(const __grid_constant__ LaunchParams p) {
  const uint32_t row_step = gridDim.x * blockDim.y;
  for (uint32_t row = blockIdx.x * blockDim.y + threadIdx.y; row < p.rows; row += row_step) {
    const uint32_t token = row % p.n_tokens;
    const uint32_t layer_kv = row / p.n_tokens;
    const uint32_t kv = layer_kv & 1u;
    const uint32_t layer = p.layer_first + (layer_kv >> 1);
    const uint32_t block = token / p.block_tokens;
    const uint32_t block_token_first = block * p.block_tokens;
    const uint32_t block_tokens = min(p.block_tokens, p.n_tokens - block_token_first);
    const uint64_t position = p.first_token + token;
    const int32_t page = p.page_table[position / p.page_tokens];
    if (page < 0 || static_cast<uint32_t>(page) >= p.pages_total) continue;
    const uint32_t slot = static_cast<uint32_t>(position % p.page_tokens);

    uint8_t* cache_row = (kv == 0 ? p.k[layer] : p.v[layer]) +
                         static_cast<uint64_t>(page) * p.plan.page_stride +
                         slot * p.plan.slot_stride;
    uint8_t* image_row = static_cast<uint8_t*>(p.block_images[block]) +
                         ((uint64_t{layer} * 2 + kv) * block_tokens + (token - block_token_first)) *
                             p.plan.row_bytes;

    if (reinterpret_cast<uintptr_t>(image_row) % sizeof(Vec) != 0) {
      for (uint64_t b = threadIdx.x; b < p.plan.row_bytes; b += blockDim.x) {
        const uint64_t unit = b / p.plan.unit_bytes;
        const uint64_t offset = b - unit * p.plan.unit_bytes;
        move<kGather>(cache_row + unit * p.plan.head_stride + offset, image_row + b);
      }
      continue;
    }
    for (uint32_t c = threadIdx.x; c < p.vecs_per_row; c += blockDim.x) {
      const uint32_t unit = c / p.vecs_per_unit;
      const uint32_t offset = c - unit * p.vecs_per_unit;
      move<kGather>(reinterpret_cast<Vec*>(cache_row + unit * p.plan.head_stride) + offset,
                    reinterpret_cast<Vec*>(image_row) + c);
    }
  }
}

KernelStatus report(cudaError_t error, int* ret_device_error) {
  if (error == cudaSuccess) return KernelStatus::ok;
  if (ret_device_error != nullptr) *ret_device_error = static_cast<int>(error);
  return KernelStatus::device_error;
}

bool aligned(uint64_t value, uint64_t width) {
  return value % width == 0;
}

// The widest vector that every cache address of the transfer is a multiple of.
uint64_t pick_vector_bytes(const LaunchParams& p, uint32_t layer_end) {
  uint64_t width = vector_bytes_max;
  const uint64_t strides[] = {p.plan.unit_bytes, p.plan.row_bytes, p.plan.page_stride,
                              p.plan.head_stride, p.plan.slot_stride};
  auto fits = [&](uint64_t w) {
    for (uint64_t stride : strides) {
      if (!aligned(stride, w)) return false;
    }
    for (uint32_t layer = p.layer_first; layer < layer_end; ++layer) {
      if (!aligned(reinterpret_cast<uintptr_t>(p.k[layer]), w)) return false;
      if (!aligned(reinterpret_cast<uintptr_t>(p.v[layer]), w)) return false;
    }
    return true;
  };
  while (width > 1 && !fits(width)) width /= 2;
  return width;
}

template <bool kGather, typename Vec>
cudaError_t launch_as(const LaunchParams& p, cudaStream_t stream) {
  uint32_t row_threads = 1;
  while (row_threads < p.vecs_per_row && row_threads < cta_threads) row_threads *= 2;
  const dim3 block(row_threads, cta_threads / row_threads);
  const uint32_t ctas = (p.rows + block.y - 1) / block.y;
  const dim3 grid(ctas < grid_ctas_max ? ctas : grid_ctas_max);
  transfer_kernel<kGather, Vec><<<grid, block, 0, stream>>>(p);
  return cudaGetLastError();
}

template <bool kGather>
KernelStatus transfer_cuda(const PagedKvCache& cache, const BlockTransfer& t, void* stream,
                           int* ret_device_error) {
  if (KernelStatus status = validate_transfer(cache, t); status != KernelStatus::ok) {
    return status;
  }
  const KvCacheGeometry& g = cache.geometry;
  LaunchParams p{};
  p.plan = make_transfer_plan(g);
  const uint32_t layer_count = transfer_layer_count(g, t);
  const uint32_t layer_end = t.layer_first + layer_count;
  for (uint32_t layer = t.layer_first; layer < layer_end; ++layer) {
    p.k[layer] = static_cast<uint8_t*>(cache.k[layer]);
    p.v[layer] =
        p.plan.fused ? p.k[layer] + p.plan.v_offset : static_cast<uint8_t*>(cache.v[layer]);
  }
  p.page_table = t.page_table;
  p.block_images = t.block_images;
  p.first_token = t.first_token;
  p.n_tokens = t.n_tokens;
  p.block_tokens = t.block_tokens;
  p.layer_first = t.layer_first;
  p.rows = layer_count * 2 * t.n_tokens;
  p.page_tokens = g.page_tokens;
  p.pages_total = g.pages_total;

  const uint64_t width = pick_vector_bytes(p, layer_end);
  p.vecs_per_row = static_cast<uint32_t>(p.plan.row_bytes / width);
  p.vecs_per_unit = static_cast<uint32_t>(p.plan.unit_bytes / width);
  auto* s = static_cast<cudaStream_t>(stream);
  cudaError_t error = cudaSuccess;
  switch (width) {
    case 16:
      error = launch_as<kGather, uint4>(p, s);
      break;
    case 8:
      error = launch_as<kGather, uint2>(p, s);
      break;
    case 4:
      error = launch_as<kGather, uint32_t>(p, s);
      break;
    case 2:
      error = launch_as<kGather, uint16_t>(p, s);
      break;
    default:
      error = launch_as<kGather, uint8_t>(p, s);
      break;
  }
  return report(error, ret_device_error);
}

}  // namespace

bool cuda_built() {
  return true;
}

KernelStatus cuda_device_count(int* ret_count, int* ret_device_error) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    if (ret_device_error != nullptr) *ret_device_error = static_cast<int>(error);
    return KernelStatus::device_unavailable;
  }
  if (count == 0) return KernelStatus::device_unavailable;
  *ret_count = count;
  return KernelStatus::ok;
}

KernelStatus cuda_host_register(void* host, uint64_t bytes, void** ret_device_pointer,
                                int* ret_device_error) {
  if (host == nullptr || bytes == 0) return KernelStatus::bad_pointer;
  cudaError_t error =
      cudaHostRegister(host, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (error != cudaSuccess) return report(error, ret_device_error);
  void* device = nullptr;
  error = cudaHostGetDevicePointer(&device, host, 0);
  if (error != cudaSuccess) {
    cudaHostUnregister(host);
    return report(error, ret_device_error);
  }
  *ret_device_pointer = device;
  return KernelStatus::ok;
}

KernelStatus cuda_host_unregister(void* host, int* ret_device_error) {
  if (host == nullptr) return KernelStatus::bad_pointer;
  return report(cudaHostUnregister(host), ret_device_error);
}

KernelStatus gather_cuda(const PagedKvCache& cache, const BlockTransfer& transfer, void* stream,
                         int* ret_device_error) {
  return transfer_cuda<true>(cache, transfer, stream, ret_device_error);
}

KernelStatus scatter_cuda(const PagedKvCache& cache, const BlockTransfer& transfer, void* stream,
                          int* ret_device_error) {
  return transfer_cuda<false>(cache, transfer, stream, ret_device_error);
}

}  // namespace kvpark::kernels
