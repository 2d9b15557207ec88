// Flag parsing for kvparkd (see options.h).
#include "daemon/options.h"

#include <getopt.h>
#include <unistd.h>

#include <cstdio>
#include <limits>

#include "proto/limits.h"
#include "proto/paths.h"

namespace kvpark::daemon {

bool parse_size(const std::string& text, uint64_t& ret_bytes) {
  size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (...) {
    return false;
  }
  std::string suffix = text.substr(used);
  uint64_t scale = 1;
  if (suffix == "" || suffix == "B") scale = 1;
  else if (suffix == "K" || suffix == "KiB") scale = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB") scale = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB") scale = 1ull << 30;
  else if (suffix == "T" || suffix == "TiB") scale = 1ull << 40;
  else return false;
  if (value > std::numeric_limits<uint64_t>::max() / scale) return false;
  ret_bytes = value * scale;
  return true;
}

namespace {

void print_usage(FILE* out) {
  fprintf(out,
          "Usage: kvparkd [OPTIONS]\n"
          "Keeps parked LLM inference state for the engines on this machine.\n\n"
          "  --socket PATH          engine socket (default %s)\n"
          "  --arena-size SIZE      host arena data bytes, e.g. 8G (default 1G)\n"
          "  --arena-name NAME      POSIX shared-memory name (default /kvpark-arena-$EUID)\n"
          "  --reservation-max SIZE largest single reservation (default half the arena)\n"
          "  --attach-group GROUP   members of GROUP may attach (default kvpark)\n"
          "  -h, --help             show this help\n",
          default_socket_path().c_str());
}

}  // namespace

bool parse_options(int argc, char** argv, DaemonOptions& o, int& ret_exit) {
  enum { opt_socket = 1, opt_arena_size, opt_arena_name, opt_reservation, opt_group };
  static const option long_options[] = {
      {"socket", required_argument, nullptr, opt_socket},
      {"arena-size", required_argument, nullptr, opt_arena_size},
      {"arena-name", required_argument, nullptr, opt_arena_name},
      {"reservation-max", required_argument, nullptr, opt_reservation},
      {"attach-group", required_argument, nullptr, opt_group},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  o.socket_path = default_socket_path();
  o.arena_name = "/kvpark-arena-" + std::to_string(geteuid());
  o.arena_bytes = limits::arena_bytes_default;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options, nullptr)) != -1) {
    switch (c) {
      case opt_socket: o.socket_path = optarg; break;
      case opt_arena_name: o.arena_name = optarg; break;
      case opt_group: o.attach_group = optarg; break;
      case opt_arena_size:
        if (!parse_size(optarg, o.arena_bytes) || o.arena_bytes < limits::arena_bytes_min) {
          fprintf(stderr, "kvparkd: --arena-size: '%s' is not a size of at least %llu bytes\n",
                  optarg, static_cast<unsigned long long>(limits::arena_bytes_min));
          ret_exit = 2;
          return false;
        }
        break;
      case opt_reservation:
        if (!parse_size(optarg, o.reservation_bytes_max) || o.reservation_bytes_max == 0) {
          fprintf(stderr, "kvparkd: --reservation-max: '%s' is not a positive size\n", optarg);
          ret_exit = 2;
          return false;
        }
        break;
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
  if (o.reservation_bytes_max == 0) o.reservation_bytes_max = o.arena_bytes / 2;
  return true;
}

}  // namespace kvpark::daemon
