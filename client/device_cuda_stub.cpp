// device_cuda.h for builds without CUDA: nothing is usable.
#include "client/device_cuda.h"

namespace kvpark::client::cuda {

bool built() {
  return false;
}
DeviceGuard::DeviceGuard(int) : error_(unavailable) {}
DeviceGuard::~DeviceGuard() = default;
int check_device(int) {
  return unavailable;
}
int event_create(void**) {
  return unavailable;
}
int event_record(void*, void*) {
  return unavailable;
}
int event_query(void*, bool* ret_done) {
  *ret_done = false;
  return unavailable;
}
int event_synchronize(void*) {
  return unavailable;
}
void event_destroy(void*) {}
int host_alloc_mapped(size_t, void**, void**) {
  return unavailable;
}
void host_free(void*) {}
const char* error_string(int) {
  return "libkvpark built without CUDA";
}

}  // namespace kvpark::client::cuda
