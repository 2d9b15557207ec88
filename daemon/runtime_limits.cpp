// Run-time limits: ranges and refusal messages (see runtime_limits.h).
#include "daemon/runtime_limits.h"

#include <cstdio>

#include "daemon/config.h"
#include "daemon/control.h"
#include "proto/limits.h"
#include "proto/size.h"

namespace kvpark::daemon {
namespace {

constexpr const char* runtime_limits[] = {limit_arena_low_water, limit_reservation_max,
                                          limit_disk_capacity, limit_disk_write_budget};

Status out_of_range(const std::string& name, uint64_t value, uint64_t low, uint64_t high,
                    const std::string& cause, std::string& ret_message) {
  ret_message = name + " " + describe_bytes(value) + " " + cause + ": allowed " +
                describe_bytes(low) + " to " + describe_bytes(high);
  return Status::InvalidArgument;
}

}  // namespace

std::string describe_bytes(uint64_t bytes) {
  constexpr size_t readable_digits_max = 4;  // "1023", "512M"; not "264212084K"
  const std::string exact = format_size(bytes);
  const size_t digits = exact.find_first_not_of("0123456789");
  if ((digits == std::string::npos ? exact.size() : digits) <= readable_digits_max) return exact;
  static const char* units[] = {"K", "M", "G", "T", "P", "E"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char rounded[32];
  snprintf(rounded, sizeof rounded, "%.1f%s", value, units[unit]);
  return std::to_string(bytes) + " bytes (" + rounded + ")";
}

std::string runtime_limit_names() {
  std::string out;
  for (const char* n : runtime_limits) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

Status check_runtime_limit(const std::string& name, uint64_t value, const LimitBounds& bounds,
                           std::string& ret_message) {
  if (name == limit_arena_low_water) {
    if (value > bounds.arena_bytes) {
      return out_of_range(name, value, 0, bounds.arena_bytes,
                          "is larger than the arena (" + describe_bytes(bounds.arena_bytes) + ")",
                          ret_message);
    }
    return Status::Ok;
  }
  if (name == limit_reservation_max) {
    if (value < limits::extent_align_bytes) {
      return out_of_range(name, value, limits::extent_align_bytes, bounds.arena_bytes,
                          "is smaller than one extent", ret_message);
    }
    if (value > bounds.arena_bytes) {
      return out_of_range(name, value, limits::extent_align_bytes, bounds.arena_bytes,
                          "is larger than the arena (" + describe_bytes(bounds.arena_bytes) + ")",
                          ret_message);
    }
    return Status::Ok;
  }
  if (name == limit_disk_capacity || name == limit_disk_write_budget) {
    if (!bounds.disk_enabled) {
      ret_message = name + ": kvparkd runs without a disk tier (disk_dir is off)";
      return Status::BadState;
    }
    if (name == limit_disk_capacity && value > bounds.disk_filesystem_bytes) {
      return out_of_range(name, value, 0, bounds.disk_filesystem_bytes,
                          "is larger than the file system holding " + bounds.disk_directory + " (" +
                              describe_bytes(bounds.disk_filesystem_bytes) + ")",
                          ret_message);
    }
    return Status::Ok;
  }
  ret_message = "unknown limit '" + name + "'; the limits are " + runtime_limit_names();
  return Status::InvalidArgument;
}

}  // namespace kvpark::daemon
