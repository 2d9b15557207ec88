// kvparkd's options: every setting, its embedded default, and where it came from.
// The config file (config.h) and the command line (command_line.h) set them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "proto/paths.h"
#include "shm/arena.h"

namespace kvpark::daemon {

// Which message bus the D-Bus adapter joins.
enum class DbusBus : uint8_t { Off = 0, Session = 1, System = 2 };

inline constexpr const char* config_path_default = kvpark::daemon_config_path_default;

// Every field is also a key of kvparkd.conf (config.h holds the key table).
struct DaemonOptions {
  std::string socket_path;             // default: kvpark::default_socket_path()
  std::string arena_name;              // memfd name (in /proc/PID/fd); default "/kvpark-arena-$EUID"
  uint64_t arena_bytes = 0;            // data region; default limits::arena_bytes_default
  shm::HugePages huge_pages = shm::HugePages::Try;  // try | on | off, as PostgreSQL's
  uint64_t reservation_bytes_max = 0;  // default: half the arena
  // Unsealed bytes one connection, one uid may hold (0: finish_options sets a quarter,
  // a half of the arena: limits::unsealed_connection_share, unsealed_uid_share).
  uint64_t unsealed_connection_bytes_max = 0;
  uint64_t unsealed_uid_bytes_max = 0;
  std::string attach_group = "kvpark"; // members may attach; ignored if the group is missing
  std::string admin_group = "kvpark-admin";  // members may mutate over D-Bus (root always may)
  uint64_t arena_low_water_bytes = 0;  // evict (LRU) to keep this many bytes free
  bool arena_low_water_set = false;    // given by a layer; else derived (finish_options)
  std::string http_listen = http_listen_default;  // "host:port", "[v6]:port"; empty: off
  bool http_allow_remote = false;      // a non-loopback http_listen needs this
  DbusBus dbus_bus = DbusBus::Session; // default: System under systemd, else Session
  std::string disk_directory;          // disk tier records; empty: no disk tier
  std::string state_directory;         // runtime overrides; default $STATE_DIRECTORY; empty: off
  std::string kept_memory_directory;   // state segment, index memory: a tmpfs; empty: memfds
  uint64_t disk_capacity_bytes = 0;    // 0: the daemon sizes the tier from free space
  uint64_t disk_write_budget_bytes_per_day = 0;  // 0: no budget
  bool spill_on_shutdown = true;       // write valuable host-only entries to disk at stop
  std::string remote;                  // "redis://host:port[,host:port...]"; empty: no remote tier
  std::string remote_user;             // ACL user; empty: AUTH with the password alone
  std::string remote_password_file;    // its first line is the password; empty: no AUTH
  std::string remote_write = "shared"; // shared | all | off: which sealed blocks are written behind
  uint64_t watchdog_usec = 0;          // from $WATCHDOG_USEC (systemd); 0: no watchdog

  // Where the values came from, for --print-config and reload.
  std::string config_path;             // the file named (read when it exists)
  bool config_path_explicit = false;   // --config given: a missing file is an error
  bool config_file_read = false;       // the file existed and was applied
  std::vector<std::pair<std::string, std::string>> flag_values;  // key, value from argv
  std::vector<std::pair<std::string, std::string>> override_values;  // key, value in force
                                                                     // from the overrides file
  std::string overrides_warning;       // why the overrides file was not applied; empty: it was
};

}  // namespace kvpark::daemon
