// What the device API (device.cpp) needs from libkvpark's opaque handles.
//
// The handle structs are complete only in kvpark.cpp, which defines these accessors. The
// device library is optional: libkvpark never calls into it except through
// `transfer_in_flight_hook`, which stays null unless a device was attached.
#pragma once

#include <atomic>

#include "client/channel.h"
#include "client/kvpark.h"
#include "proto/types.h"

namespace kvpark::client {

// The namespace geometry the client said HELLO with.
Geometry client_geometry(const kvpark_client* client);

// The client a plan or reservation was made on, and the arena attachment it points into.
struct HandleView {
  kvpark_client* client = nullptr;
  const Attachment* attachment = nullptr;
};
HandleView plan_view(const kvpark_plan* plan);
HandleView reservation_view(const kvpark_reservation* reservation);

// Set by the device library: true when a device transfer that reads or writes `handle` (a
// plan or reservation) has not completed. kvpark_plan_release, kvpark_seal and kvpark_abort
// assert it is false: releasing earlier lets the daemon reuse bytes a copy still touches.
inline std::atomic<bool (*)(const void* handle)> transfer_in_flight_hook{nullptr};

inline bool handle_has_transfer_in_flight(const void* handle) {
  bool (*hook)(const void*) = transfer_in_flight_hook.load(std::memory_order_acquire);
  return hook != nullptr && hook(handle);
}

}  // namespace kvpark::client
