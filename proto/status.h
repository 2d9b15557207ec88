// Operational outcomes, shared by the daemon, the wire protocol and libkvpark.
//
// A closed set: every verb answers with one of these. Values are part of the wire
// protocol and of the C ABI (kvpark.h mirrors them); append, never renumber.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvpark {

enum class Status : uint16_t {
  Ok = 0,
  NotFound = 1,          // no such lease, reservation or entry
  AlreadyPresent = 2,    // the entry is parked already; nothing to write
  InFlight = 3,          // another client holds an open reservation for it
  ArenaFull = 4,         // no room even after evicting every unleased entry
  LimitExceeded = 5,     // a per-connection or per-request cap (see proto/limits.h)
  InvalidArgument = 6,   // well-formed request with values that make no sense
  GeometryMismatch = 7,  // HELLO for a known namespace with different geometry
  ProtocolError = 8,     // malformed frame; the daemon closes the connection
  Unavailable = 9,       // daemon not running or connection lost
  Corrupt = 10,          // an arena header or entry header failed its check
  BadState = 11,         // verb not valid now (e.g. LOOKUP before HELLO)
  PermissionDenied = 12,
  IoError = 13,          // a system call failed; errno is reported beside it
  Timeout = 14,          // WAIT ran out of time; what is ready stays usable
  OutOfMemory = 15,      // libkvpark could not allocate; the daemon never answers it
};

inline constexpr std::string_view status_name(Status status) {
  switch (status) {
    case Status::Ok: return "ok";
    case Status::NotFound: return "not found";
    case Status::AlreadyPresent: return "already present";
    case Status::InFlight: return "in flight";
    case Status::ArenaFull: return "arena full";
    case Status::LimitExceeded: return "limit exceeded";
    case Status::InvalidArgument: return "invalid argument";
    case Status::GeometryMismatch: return "namespace geometry mismatch";
    case Status::ProtocolError: return "protocol error";
    case Status::Unavailable: return "daemon unavailable";
    case Status::Corrupt: return "corrupt";
    case Status::BadState: return "bad state";
    case Status::PermissionDenied: return "permission denied";
    case Status::IoError: return "I/O error";
    case Status::Timeout: return "timed out";
    case Status::OutOfMemory: return "out of memory";
  }
  return "unknown status";
}

inline constexpr Status status_last = Status::OutOfMemory;
inline constexpr bool status_is_known(uint16_t value) {
  return value <= static_cast<uint16_t>(status_last);
}

}  // namespace kvpark
