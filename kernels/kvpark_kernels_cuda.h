// kvpark_kernels_cuda.h — CUDA gather (park) and scatter (restore), same semantics as *_cpu.
//
// Model. One launch moves every layer of the transfer (or its layer subrange) between a
// paged device KV cache and block images, which normally live in host memory registered with
// cuda_host_register and are addressed through their device pointers (zero-copy: the kernel
// stores straight into pinned host memory over the bus; no staging copy). Copies use 16-byte
// vectors when every stride and base pointer allows, narrower ones otherwise; an image whose
// address breaks that alignment is copied bytewise, so alignment never changes results.
//
// Pointers: cache.k / cache.v are host arrays of device pointers (passed in the launch);
// transfer.page_table and transfer.block_images must be device-accessible and stay valid and
// unchanged until the stream reaches the copy. Their contents are not read on the host, so the
// caller checks them with validate_transfer_arrays on its host copy; on the device, a page id
// outside [0, pages_total) is skipped (nothing read or written for it), never followed.
//
// This header needs no CUDA headers: a stream is passed as void* (a cudaStream_t; nullptr =
// the legacy default stream). In a build without CUDA every function returns
// device_unavailable. Functions return device_error with the cudaError_t value in
// *ret_device_error (when non-null) if the runtime fails; launches are asynchronous.
#pragma once

#include <cstdint>

#include "kvpark_kernels.h"

namespace kvpark::kernels {

// True when this library was built with the CUDA implementation.
bool cuda_built();

// Number of CUDA devices; device_unavailable when there are none or no driver.
KernelStatus cuda_device_count(int* ret_count, int* ret_device_error = nullptr);

// Pins and maps [host, host + bytes) for zero-copy device access (cudaHostRegister, mapped
// and portable); *ret_device_pointer is the device address of `host`.
KernelStatus cuda_host_register(void* host, uint64_t bytes, void** ret_device_pointer,
                                int* ret_device_error = nullptr);
// Undoes cuda_host_register.
KernelStatus cuda_host_unregister(void* host, int* ret_device_error = nullptr);

// Park: device cache -> block images, enqueued on `stream`. Validates the descriptor first.
KernelStatus gather_cuda(const PagedKvCache& cache, const BlockTransfer& transfer, void* stream,
                         int* ret_device_error = nullptr);
// Restore: block images -> device cache, enqueued on `stream`; touches only the range.
KernelStatus scatter_cuda(const PagedKvCache& cache, const BlockTransfer& transfer, void* stream,
                          int* ret_device_error = nullptr);

}  // namespace kvpark::kernels
