// The few CUDA runtime calls the device API makes besides the kernels: device selection,
// events and mapped pinned staging memory. Needs no CUDA headers; every function returns
// the cudaError_t value (0 = success). In a build without CUDA every call returns
// `unavailable` and built() is false.
#pragma once

#include <cstddef>

namespace kvpark::client::cuda {

inline constexpr int unavailable = 35;  // cudaErrorInsufficientDriver: nothing to talk to

bool built();

// Makes `ordinal` the calling thread's device for the guard's lifetime, then restores the
// previous one, so engine threads keep their own current device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  int error() const { return error_; }

 private:
  int previous_ = -1;
  int error_ = 0;
};

// 0 when `ordinal` names a usable device.
int check_device(int ordinal);

// Events are created without timing.
int event_create(void** ret_event);
int event_record(void* event, void* stream);
// *ret_done: the event has completed (0 returned) — a failed earlier launch is an error.
int event_query(void* event, bool* ret_done);
int event_synchronize(void* event);
void event_destroy(void* event);

// Pinned, mapped host memory: the kernel reads page tables and image pointers from it.
int host_alloc_mapped(size_t bytes, void** ret_host, void** ret_device);
void host_free(void* host);

// A static description of an error value ("no CUDA" without CUDA).
const char* error_string(int error);

}  // namespace kvpark::client::cuda
