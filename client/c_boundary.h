// The C boundary of libkvpark (kvpark.h, kvpark_device.h, kvpark_planner.h): no C++
// exception may unwind into a C caller.
//
// Every extern "C" body that can throw (it allocates, locks or starts a thread) is a
// function-try-block whose handler returns status_of_current_exception(), or, for the
// void ones, cleans up what it was given and returns. Accessors that only read fields
// cannot throw and need none. kvpark_status mirrors kvpark::Status value for value.
#pragma once

#include <new>
#include <stdexcept>

#include "client/kvpark.h"
#include "proto/status.h"

namespace kvpark::client {

#define KVPARK_MIRRORS(c_value, cpp_value) \
  static_assert(static_cast<int>(c_value) == static_cast<int>(Status::cpp_value), \
                "kvpark.h mirrors proto/status.h")
KVPARK_MIRRORS(KVPARK_OK, Ok);
KVPARK_MIRRORS(KVPARK_NOT_FOUND, NotFound);
KVPARK_MIRRORS(KVPARK_ALREADY_PRESENT, AlreadyPresent);
KVPARK_MIRRORS(KVPARK_IN_FLIGHT, InFlight);
KVPARK_MIRRORS(KVPARK_ARENA_FULL, ArenaFull);
KVPARK_MIRRORS(KVPARK_LIMIT_EXCEEDED, LimitExceeded);
KVPARK_MIRRORS(KVPARK_INVALID_ARGUMENT, InvalidArgument);
KVPARK_MIRRORS(KVPARK_GEOMETRY_MISMATCH, GeometryMismatch);
KVPARK_MIRRORS(KVPARK_PROTOCOL_ERROR, ProtocolError);
KVPARK_MIRRORS(KVPARK_UNAVAILABLE, Unavailable);
KVPARK_MIRRORS(KVPARK_CORRUPT, Corrupt);
KVPARK_MIRRORS(KVPARK_BAD_STATE, BadState);
KVPARK_MIRRORS(KVPARK_PERMISSION_DENIED, PermissionDenied);
KVPARK_MIRRORS(KVPARK_IO_ERROR, IoError);
KVPARK_MIRRORS(KVPARK_TIMEOUT, Timeout);
KVPARK_MIRRORS(KVPARK_OUT_OF_MEMORY, OutOfMemory);
#undef KVPARK_MIRRORS
static_assert(KVPARK_OUT_OF_MEMORY == static_cast<int>(status_last),
              "a new Status needs its C value in kvpark.h and here");

// The status for the exception being handled (call it only inside a catch handler):
// allocation failures are KVPARK_OUT_OF_MEMORY; a thread or lock the system refused,
// or anything else the library could not finish, KVPARK_IO_ERROR.
inline kvpark_status status_of_current_exception() noexcept {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return KVPARK_OUT_OF_MEMORY;
  } catch (const std::length_error&) {  // a size no allocation could hold
    return KVPARK_OUT_OF_MEMORY;
  } catch (...) {
    return KVPARK_IO_ERROR;
  }
}

}  // namespace kvpark::client
