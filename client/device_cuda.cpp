// device_cuda.h over the CUDA runtime (built only when kernels_have_cuda).
#include "client/device_cuda.h"

#include <cuda_runtime_api.h>

namespace kvpark::client::cuda {

bool built() {
  return true;
}

DeviceGuard::DeviceGuard(int ordinal) {
  if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
  if (previous_ != ordinal) error_ = cudaSetDevice(ordinal);
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  if (previous_ >= 0 && cudaGetDevice(&current) == cudaSuccess && current != previous_) {
    (void)cudaSetDevice(previous_);
  }
}

int check_device(int ordinal) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return e;
  if (ordinal < 0 || ordinal >= count) return cudaErrorInvalidDevice;
  return cudaSuccess;
}

int event_create(void** ret_event) {
  cudaEvent_t event = nullptr;
  const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
  if (e == cudaSuccess) *ret_event = event;
  return e;
}

int event_record(void* event, void* stream) {
  return cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
}

int event_query(void* event, bool* ret_done) {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  *ret_done = e == cudaSuccess;
  return e == cudaErrorNotReady ? cudaSuccess : e;
}

int event_synchronize(void* event) {
  return cudaEventSynchronize(static_cast<cudaEvent_t>(event));
}

void event_destroy(void* event) {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

int host_alloc_mapped(size_t bytes, void** ret_host, void** ret_device) {
  void* host = nullptr;
  cudaError_t e = cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) return e;
  void* device = nullptr;
  e = cudaHostGetDevicePointer(&device, host, 0);
  if (e != cudaSuccess) {
    (void)cudaFreeHost(host);
    return e;
  }
  *ret_host = host;
  *ret_device = device;
  return cudaSuccess;
}

void host_free(void* host) {
  (void)cudaFreeHost(host);
}

const char* error_string(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

}  // namespace kvpark::client::cuda
