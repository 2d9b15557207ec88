// The limits `kvparkctl set-limit` changes at run time (control.h names them):
// which values each accepts and, for one it refuses, a message naming the cause
// and the allowed range, with the figures.
//
//   arena-low-water    0 .. the arena's data bytes
//   reservation-max    limits::extent_align_bytes .. the arena's data bytes
//   disk-capacity      0 (sized from free space) .. the disk directory's file system
//   disk-write-budget  any (0: no budget)
// The disk limits need a disk tier (BadState without one).
#pragma once

#include <cstdint>
#include <string>

#include "proto/status.h"

namespace kvpark::daemon {

// What the allowed ranges depend on, read where the limit is applied.
struct LimitBounds {
  uint64_t arena_bytes = 0;  // the arena's data region
  bool disk_enabled = false;
  std::string disk_directory;
  uint64_t disk_filesystem_bytes = 0;  // size of the file system holding disk_directory
};

// Ok when `value` is allowed for limit `name`; else InvalidArgument (unknown
// name, out of range) or BadState (a disk limit without a disk tier), with the
// reason in ret_message.
Status check_runtime_limit(const std::string& name, uint64_t value, const LimitBounds& bounds,
                           std::string& ret_message);

// "512M" for a short exact binary size, else "76235669504 bytes (71.0G)".
std::string describe_bytes(uint64_t bytes);

// The known names, comma-separated, for messages.
std::string runtime_limit_names();

}  // namespace kvpark::daemon
