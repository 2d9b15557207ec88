// kvparkd's command line: embedded defaults, overridden by flags.
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::daemon {

struct DaemonOptions {
  std::string socket_path;             // default: kvpark::default_socket_path()
  std::string arena_name;              // shm_open name; default "/kvpark-arena-$EUID"
  uint64_t arena_bytes = 0;            // data region; default limits::arena_bytes_default
  uint64_t reservation_bytes_max = 0;  // default: half the arena
  std::string attach_group = "kvpark"; // members may attach; ignored if the group is missing
};

// Parses argv. Returns 0 to run, or an exit code (0 after --help, 2 on a bad flag)
// through ret_exit with a message already printed.
bool parse_options(int argc, char** argv, DaemonOptions& ret_options, int& ret_exit);

// "64M", "1G", "1GiB", "1073741824" -> bytes; false on anything else.
bool parse_size(const std::string& text, uint64_t& ret_bytes);

}  // namespace kvpark::daemon
