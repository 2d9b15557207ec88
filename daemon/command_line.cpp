// Flag parsing for kvparkd (see command_line.h).
#include "daemon/command_line.h"

#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "daemon/config.h"
#include "proto/limits.h"
#include "proto/paths.h"
#include "proto/size.h"
#include "proto/version.h"

namespace kvpark::daemon {

namespace {

// The defaults shown are computed as the daemon computes them (default_options, then
// finish_options), so --help cannot say one thing while the daemon runs with another.
void print_usage(FILE* out) {
  DaemonOptions plain = default_options();
  plain.disk_directory.clear();
  DaemonOptions with_disk = default_options();
  with_disk.disk_directory = "/";
  std::string ignored;
  finish_options(plain, ignored);
  finish_options(with_disk, ignored);
  const DaemonOptions here = default_options();
  const std::string dbus_here = here.dbus_bus == DbusBus::System ? "system" : "session";
  const auto from_state = [](const std::string& dir) {
    return dir.empty() ? std::string("$STATE_DIRECTORY, unset here: off")
                       : "$STATE_DIRECTORY: " + dir;
  };
  const std::string disk_default = from_state(here.disk_directory);
  const std::string state_default = from_state(here.state_directory);
  fprintf(out,
          "Usage: kvparkd [OPTIONS]\n"
          "Keeps parked LLM inference state for the engines on this machine.\n"
          "Values come from the embedded defaults, then %s, then these flags.\n\n"
          "  --config PATH                    configuration file (see kvparkd.conf(5))\n"
          "  --print-config                   print the effective configuration and exit\n"
          "  --socket PATH                    engine socket (default %s)\n"
          "  --arena-size SIZE                host arena data bytes, e.g. 8G (default %s)\n"
          "  --arena-name NAME                arena memfd name, shown in /proc (default /kvpark-arena-$EUID)\n"
          "  --huge-pages try|on|off          huge pages for the arena (default try)\n"
          "  --reservation-max SIZE           largest single reservation (default half the arena: %s)\n"
          "  --unsealed-per-connection SIZE   reserved, unsealed: one connection (default 1/4 arena)\n"
          "  --unsealed-per-uid SIZE          reserved and unsealed, one uid (default 1/2 arena)\n"
          "  --arena-low-water SIZE           evict to keep this much of the arena free\n"
          "                                   (default %s; with a disk tier 1/8 of the arena: %s)\n"
          "  --attach-group GROUP             members of GROUP may attach (default kvpark)\n"
          "  --admin-group GROUP              members of GROUP may change state over D-Bus\n"
          "  --http-listen ADDR:PORT|off      HTTP status and metrics (default 127.0.0.1:7797)\n"
          "  --http-allow-remote[=BOOL]       allow a non-loopback --http-listen\n"
          "  --dbus auto|session|system|off   message bus to join (default auto: %s here)\n"
          "  --disk-dir PATH|off              disk tier directory (default %s)\n"
          "  --disk-capacity SIZE             disk tier size (default 0: from free space)\n"
          "  --disk-write-budget-per-day SIZE bytes the disk tier may write per day (default %s)\n"
          "  --spill-on-shutdown[=BOOL]       spill valuable host entries to disk at stop (default %s)\n"
          "  --state-dir PATH|off             where set-limit changes are kept (default %s)\n"
          "  --kept-memory-dir PATH|off       a tmpfs for what a restart adopts besides the arena\n"
          "                                   (state segment, index memory; default off: memfds)\n"
          "  --remote redis://HOST:PORT[,...]|off  remote tier: Redis or Redis Cluster seeds (default off)\n"
          "  --remote-user NAME|off           ACL user for the remote store (default off)\n"
          "  --remote-password-file PATH|off  file whose first line is the store's password (default off)\n"
          "  --remote-write shared|all|off    sealed blocks written to the remote store (default shared)\n"
          "  --version                        print the version and exit\n"
          "  -h, --help                       show this help\n",
          config_path_default, default_socket_path().c_str(), format_size(plain.arena_bytes).c_str(),
          format_size(plain.reservation_bytes_max).c_str(),
          format_size(plain.arena_low_water_bytes).c_str(),
          format_size(with_disk.arena_low_water_bytes).c_str(), dbus_here.c_str(),
          disk_default.c_str(), format_size(plain.disk_write_budget_bytes_per_day).c_str(),
          plain.spill_on_shutdown ? "true" : "false", state_default.c_str());
}

// Flags that are config keys: "--arena-size" sets "arena_size".
constexpr const char* key_flags[] = {
    "socket", "arena-size", "arena-name", "huge-pages", "reservation-max", "unsealed-per-connection",
    "unsealed-per-uid", "arena-low-water", "attach-group",
    "admin-group", "http-listen", "http-allow-remote", "dbus", "disk-dir", "disk-capacity",
    "disk-write-budget-per-day", "spill-on-shutdown", "state-dir", "kept-memory-dir", "remote", "remote-user",
    "remote-password-file", "remote-write",
};
constexpr size_t key_flag_count = sizeof key_flags / sizeof key_flags[0];

bool boolean_flag(const std::string& name) {
  return name == "http-allow-remote" || name == "spill-on-shutdown";
}

}  // namespace

bool parse_options(int argc, char** argv, DaemonOptions& o, int& ret_exit) {
  enum { opt_config = 1, opt_print_config, opt_version, opt_key_base = 256 };
  std::vector<option> long_options;
  for (size_t i = 0; i < key_flag_count; ++i) {
    long_options.push_back({key_flags[i],
                            boolean_flag(key_flags[i]) ? optional_argument : required_argument,
                            nullptr, opt_key_base + static_cast<int>(i)});
  }
  long_options.push_back({"config", required_argument, nullptr, opt_config});
  long_options.push_back({"print-config", no_argument, nullptr, opt_print_config});
  long_options.push_back({"version", no_argument, nullptr, opt_version});
  long_options.push_back({"help", no_argument, nullptr, 'h'});
  long_options.push_back({nullptr, 0, nullptr, 0});

  std::vector<std::pair<std::string, std::string>> flag_values;
  std::string config_path = config_path_default;
  bool config_explicit = false;
  bool print_config = false;
  optind = 1;
  opterr = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options.data(), nullptr)) != -1) {
    if (c >= opt_key_base && c < opt_key_base + static_cast<int>(key_flag_count)) {
      std::string key = key_flags[c - opt_key_base];
      std::replace(key.begin(), key.end(), '-', '_');
      flag_values.emplace_back(key, optarg != nullptr ? optarg : "true");
      continue;
    }
    switch (c) {
      case opt_config:
        config_path = optarg;
        config_explicit = true;
        break;
      case opt_print_config: print_config = true; break;
      case opt_version:
        printf("kvparkd %s\n", version);
        ret_exit = 0;
        return false;
      case 'h':
        print_usage(stdout);
        ret_exit = 0;
        return false;
      default:
        print_usage(stderr);
        ret_exit = 2;
        return false;
    }
  }
  if (optind != argc) {
    fprintf(stderr, "kvparkd: unexpected argument '%s'\n", argv[optind]);
    ret_exit = 2;
    return false;
  }

  o = default_options();
  o.config_path = config_path;
  o.config_path_explicit = config_explicit;
  o.flag_values = flag_values;
  std::string error;
  if (!apply_config_file(config_path, config_explicit, o, error)) {
    fprintf(stderr, "kvparkd: %s\n", error.c_str());
    ret_exit = 2;
    return false;
  }
  for (const auto& [key, value] : flag_values) {
    if (!set_config_value(o, key, value, error)) {
      std::string flag = key;
      std::replace(flag.begin(), flag.end(), '_', '-');
      fprintf(stderr, "kvparkd: --%s: %s\n", flag.c_str(), error.c_str());
      ret_exit = 2;
      return false;
    }
  }
  std::string warning;
  if (!finish_with_overrides(o, error, warning)) {
    fprintf(stderr, "kvparkd: %s\n", error.c_str());
    ret_exit = 2;
    return false;
  }
  o.overrides_warning = warning;  // main logs it: --print-config says it too
  if (!warning.empty() && print_config) fprintf(stderr, "kvparkd: %s\n", warning.c_str());
  if (print_config) {
    fputs(format_config(o).c_str(), stdout);
    ret_exit = 0;
    return false;
  }
  return true;
}

}  // namespace kvpark::daemon
