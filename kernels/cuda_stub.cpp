// cuda_stub.cpp — the CUDA entry points in a build without CUDA.
//
// Model. kvpark_kernels_cuda.h is always available so callers compile either way; here every
// entry point reports device_unavailable and touches nothing.
#include "kvpark_kernels_cuda.h"

namespace kvpark::kernels {

bool cuda_built() {
  return false;
}

KernelStatus cuda_device_count(int* /*ret_count*/, int* /*ret_device_error*/) {
  return KernelStatus::device_unavailable;
}

KernelStatus cuda_host_register(void* /*host*/, uint64_t /*bytes*/, void** /*ret_device_pointer*/,
                                int* /*ret_device_error*/) {
  return KernelStatus::device_unavailable;
}

KernelStatus cuda_host_unregister(void* /*host*/, int* /*ret_device_error*/) {
  return KernelStatus::device_unavailable;
}

KernelStatus gather_cuda(const PagedKvCache& /*cache*/, const BlockTransfer& /*transfer*/,
                         void* /*stream*/, int* /*ret_device_error*/) {
  return KernelStatus::device_unavailable;
}

KernelStatus scatter_cuda(const PagedKvCache& /*cache*/, const BlockTransfer& /*transfer*/,
                          void* /*stream*/, int* /*ret_device_error*/) {
  return KernelStatus::device_unavailable;
}

}  // namespace kvpark::kernels
