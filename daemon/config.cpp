// kvparkd.conf parsing, validation and printing (see config.h); the runtime overrides
// and reload are config_reload.cpp.
#include "daemon/config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "daemon/config_keys.h"
#include "daemon/control.h"
#include "proto/limits.h"
#include "proto/paths.h"
#include "proto/size.h"
#include "remote/cluster_client.h"
#include "remote/remote_limits.h"

namespace kvpark::daemon {
namespace {

using config_detail::config_keys;
using config_detail::KeyInfo;
using config_detail::trim;

// With a disk tier and no arena_low_water given, keep 1/8 of the arena free: entries
// are demoted to disk ahead of need, so valuable ones are never just dropped.
constexpr uint64_t arena_low_water_divisor_with_disk = 8;

bool known_key(std::string_view key) {
  return std::any_of(std::begin(config_keys), std::end(config_keys),
                     [&](const KeyInfo& k) { return key == k.name; });
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(std::string_view key) {
  std::string message = "unknown key '" + std::string(key) + "'";
  for (const KeyInfo& k : config_keys) {
    if (edit_distance(key, k.name) <= 2) return message + " (did you mean '" + k.name + "'?)";
  }
  return message;
}

bool parse_bool(std::string_view text, bool& ret_value) {
  for (const char* yes : {"true", "yes", "on", "1"}) {
    if (text == yes) return ret_value = true, true;
  }
  for (const char* no : {"false", "no", "off", "0"}) {
    if (text == no) return ret_value = false, true;
  }
  return false;
}

bool set_size(std::string_view value, uint64_t minimum, uint64_t& ret_bytes,
              std::string& ret_error) {
  uint64_t bytes = 0;
  if (!parse_size(value, bytes) || bytes < minimum) {
    ret_error = "'" + std::string(value) + "' is not a size" +
                (minimum > 0 ? " of at least " + format_size(minimum) : std::string()) +
                " (bytes, or with K, M, G, T)";
    return false;
  }
  ret_bytes = bytes;
  return true;
}

bool valid_group(std::string_view value) {
  return !value.empty() && value.size() <= 64 &&
         std::none_of(value.begin(), value.end(), [](char c) { return c == ' ' || c == ':'; });
}

bool is_loopback(const std::string& host) {
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

const char* bus_name(DbusBus bus) {
  switch (bus) {
    case DbusBus::Off:
      return "off";
    case DbusBus::Session:
      return "session";
    case DbusBus::System:
      return "system";
  }
  return "off";
}

bool under_systemd() {
  return std::getenv("NOTIFY_SOCKET") != nullptr || std::getenv("INVOCATION_ID") != nullptr;
}

}  // namespace

bool parse_listen_address(std::string_view text, std::string& ret_host, uint16_t& ret_port) {
  std::string host;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return false;
    }
    host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, host.c_str(), &v6) != 1) return false;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return false;
    host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    in_addr v4{};
    if (inet_pton(AF_INET, host.c_str(), &v4) != 1) return false;
  }
  if (port_text.empty() || port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(),
                   [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  const unsigned long port = std::strtoul(std::string(port_text).c_str(), nullptr, 10);
  if (port > 65535) return false;
  ret_host = host;
  ret_port = static_cast<uint16_t>(port);
  return true;
}

DaemonOptions default_options() {
  DaemonOptions o;
  o.socket_path = default_socket_path();
  o.arena_name = "/kvpark-arena-" + std::to_string(geteuid());
  o.arena_bytes = limits::arena_bytes_default;
  o.reservation_bytes_max = 0;  // finish_options: half the arena
  o.dbus_bus = under_systemd() ? DbusBus::System : DbusBus::Session;
  if (const char* state = std::getenv("STATE_DIRECTORY"); state != nullptr && state[0] == '/') {
    const std::string all = state;
    o.disk_directory = all.substr(0, all.find(':'));  // systemd lists several with ':'
    o.state_directory = o.disk_directory;
  }
  o.disk_write_budget_bytes_per_day = 100ull << 30;
  if (const char* watchdog = std::getenv("WATCHDOG_USEC"); watchdog != nullptr) {
    const char* pid = std::getenv("WATCHDOG_PID");
    if (pid == nullptr || std::strtoll(pid, nullptr, 10) == getpid()) {
      o.watchdog_usec = std::strtoull(watchdog, nullptr, 10);
    }
  }
  o.config_path = config_path_default;
  return o;
}

bool set_config_value(DaemonOptions& o, std::string_view key, std::string_view value,
                      std::string& ret_error) {
  if (!known_key(key)) {
    ret_error = unknown_key_message(key);
    return false;
  }
  if (value.empty()) {
    ret_error = "empty value for '" + std::string(key) + "'";
    return false;
  }
  const std::string text(value);
  const auto bad = [&](const std::string& why) {
    ret_error = "bad value for '" + std::string(key) + "': " + why;
    return false;
  };
  std::string error;
  if (key == "socket") {
    if (text.front() != '/' || text.size() >= 108)
      return bad("'" + text + "' is not an absolute path shorter than 108 bytes");
    o.socket_path = text;
  } else if (key == "arena_size") {
    if (!set_size(value, limits::arena_bytes_min, o.arena_bytes, error)) return bad(error);
  } else if (key == "arena_name") {
    if (text.front() != '/' || text.find('/', 1) != std::string::npos || text.size() < 2 ||
        text.size() > 250) {
      return bad("'" + text + "' is not a shared-memory name like /kvpark-arena");
    }
    o.arena_name = text;
  } else if (key == "huge_pages") {
    if (text == "try") {
      o.huge_pages = shm::HugePages::Try;
    } else if (text == "on") {
      o.huge_pages = shm::HugePages::On;
    } else if (text == "off") {
      o.huge_pages = shm::HugePages::Off;
    } else {
      return bad("'" + text + "' is not try, on or off");
    }
  } else if (key == "reservation_max") {
    if (!set_size(value, limits::extent_align_bytes, o.reservation_bytes_max, error))
      return bad(error);
  } else if (key == "unsealed_per_connection") {
    if (!set_size(value, limits::extent_align_bytes, o.unsealed_connection_bytes_max, error))
      return bad(error);
  } else if (key == "unsealed_per_uid") {
    if (!set_size(value, limits::extent_align_bytes, o.unsealed_uid_bytes_max, error))
      return bad(error);
  } else if (key == "arena_low_water") {
    if (!set_size(value, 0, o.arena_low_water_bytes, error)) return bad(error);
    o.arena_low_water_set = true;
  } else if (key == "attach_group" || key == "admin_group") {
    if (!valid_group(value)) return bad("'" + text + "' is not a group name");
    (key == "attach_group" ? o.attach_group : o.admin_group) = text;
  } else if (key == "http_listen") {
    std::string host;
    uint16_t port = 0;
    if (text == "off") {
      o.http_listen.clear();
    } else if (!parse_listen_address(text, host, port)) {
      return bad("'" + text + "' is not 'off', ADDRESS:PORT or [IPV6]:PORT");
    } else {
      o.http_listen = text;
    }
  } else if (key == "http_allow_remote" || key == "spill_on_shutdown") {
    bool flag = false;
    if (!parse_bool(value, flag)) return bad("'" + text + "' is not a boolean (true or false)");
    (key == "http_allow_remote" ? o.http_allow_remote : o.spill_on_shutdown) = flag;
  } else if (key == "dbus") {
    if (text == "off")
      o.dbus_bus = DbusBus::Off;
    else if (text == "session")
      o.dbus_bus = DbusBus::Session;
    else if (text == "system")
      o.dbus_bus = DbusBus::System;
    else if (text == "auto")
      o.dbus_bus = under_systemd() ? DbusBus::System : DbusBus::Session;
    else
      return bad("'" + text + "' is not one of auto, session, system, off");
  } else if (key == "disk_dir" || key == "state_dir" || key == "kept_memory_dir") {
    std::string& directory = key == "disk_dir"    ? o.disk_directory
                             : key == "state_dir" ? o.state_directory
                                                  : o.kept_memory_directory;
    if (text == "off")
      directory.clear();
    else if (text.front() == '/')
      directory = text;
    else
      return bad("'" + text + "' is not 'off' or an absolute path");
  } else if (key == "remote") {
    std::vector<remote::Endpoint> seeds;
    if (text == "off")
      o.remote.clear();
    else if (remote::parse_endpoints(text, seeds) == Status::Ok)
      o.remote = text;
    else
      return bad("'" + text + "' is not 'off' or redis://host:port[,host:port...] (at most " +
                 std::to_string(remote::seeds_max) + " seeds)");
  } else if (key == "remote_user") {
    o.remote_user = text == "off" ? "" : text;
  } else if (key == "remote_password_file") {
    if (text == "off")
      o.remote_password_file.clear();
    else if (text.front() == '/')
      o.remote_password_file = text;
    else
      return bad("'" + text + "' is not 'off' or an absolute path");
  } else if (key == "remote_write") {
    if (text != "shared" && text != "all" && text != "off")
      return bad("'" + text + "' is not one of shared, all, off");
    o.remote_write = text;
  } else if (key == "disk_capacity") {
    if (!set_size(value, 0, o.disk_capacity_bytes, error)) return bad(error);
  } else if (key == "disk_write_budget_per_day") {
    if (!set_size(value, 0, o.disk_write_budget_bytes_per_day, error)) return bad(error);
  }
  return true;
}

bool apply_config_text(std::string_view text, const std::string& path, DaemonOptions& o,
                       std::string& ret_error) {
  std::map<std::string, size_t, std::less<>> seen;  // key -> line
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = trim(text.substr(0, end));
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    ++line_number;
    const std::string where = path + ":" + std::to_string(line_number) + ": ";
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) {
      ret_error =
          where + (line.front() == '[' ? "sections are not used; write 'key = value' lines"
                                       : "expected 'key = value', got '" + std::string(line) + "'");
      return false;
    }
    const std::string_view key = trim(line.substr(0, equals));
    const std::string_view value = trim(line.substr(equals + 1));
    if (auto it = seen.find(key); it != seen.end()) {
      ret_error = where + "duplicate key '" + std::string(key) + "' (first set on line " +
                  std::to_string(it->second) + ")";
      return false;
    }
    std::string error;
    if (!set_config_value(o, key, value, error)) {
      ret_error = where + error;
      return false;
    }
    seen.emplace(std::string(key), line_number);
  }
  return true;
}

bool apply_config_file(const std::string& path, bool required, DaemonOptions& o,
                       std::string& ret_error) {
  std::ifstream in(path);
  if (!in) {
    const int err = errno;
    if (err == ENOENT && !required) return true;
    ret_error = path + ": cannot read: " + strerror(err);
    return false;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (!apply_config_text(buffer.str(), path, o, ret_error)) return false;
  o.config_file_read = true;
  return true;
}

bool finish_options(DaemonOptions& o, std::string& ret_error) {
  if (o.reservation_bytes_max == 0) o.reservation_bytes_max = o.arena_bytes / 2;
  if (o.unsealed_connection_bytes_max == 0)
    o.unsealed_connection_bytes_max = o.arena_bytes / limits::unsealed_connection_share;
  if (o.unsealed_uid_bytes_max == 0)
    o.unsealed_uid_bytes_max = o.arena_bytes / limits::unsealed_uid_share;
  if (!o.arena_low_water_set) {
    o.arena_low_water_bytes =
        o.disk_directory.empty() ? 0 : o.arena_bytes / arena_low_water_divisor_with_disk;
  }
  if (o.arena_low_water_bytes > o.arena_bytes) {
    ret_error = "arena_low_water (" + format_size(o.arena_low_water_bytes) +
                ") is larger than arena_size (" + format_size(o.arena_bytes) + ")";
    return false;
  }
  if (!o.http_listen.empty()) {
    std::string host;
    uint16_t port = 0;
    parse_listen_address(o.http_listen, host, port);
    if (!is_loopback(host) && !o.http_allow_remote) {
      ret_error = "http_listen = " + o.http_listen +
                  " is not a loopback address; set http_allow_remote = true to serve it";
      return false;
    }
  }
  return true;
}

std::string format_config(const DaemonOptions& o) {
  std::string out = "# kvparkd effective configuration (kvparkd.conf(5))\n";
  out += o.config_file_read
             ? "# read from " + o.config_path + ", then the command line\n"
             : "# " + o.config_path + " not present: embedded defaults and the command line\n";
  if (!o.override_values.empty()) {
    out += "# then the runtime overrides in " + runtime_overrides_path(o) + ":";
    for (const auto& [key, value] : o.override_values) out += " " + key;
    out += "\n";
  }
  const auto line = [&out](const char* key, const std::string& value) {
    out += std::string(key) + " = " + value + "\n";
  };
  line("socket", o.socket_path);
  line("arena_size", format_size(o.arena_bytes));
  line("arena_name", o.arena_name);
  line("huge_pages", o.huge_pages == shm::HugePages::Try  ? "try"
                     : o.huge_pages == shm::HugePages::On ? "on"
                                                          : "off");
  line("reservation_max", format_size(o.reservation_bytes_max));
  line("unsealed_per_connection", format_size(o.unsealed_connection_bytes_max));
  line("unsealed_per_uid", format_size(o.unsealed_uid_bytes_max));
  line("arena_low_water", format_size(o.arena_low_water_bytes));
  line("attach_group", o.attach_group);
  line("admin_group", o.admin_group);
  line("http_listen", o.http_listen.empty() ? "off" : o.http_listen);
  line("http_allow_remote", o.http_allow_remote ? "true" : "false");
  line("dbus", bus_name(o.dbus_bus));
  line("disk_dir", o.disk_directory.empty() ? "off" : o.disk_directory);
  if (o.disk_capacity_bytes == 0 && !o.disk_directory.empty()) {
    out += "# disk_capacity 0: sized at start, what the tier holds plus 90% of the free space\n";
  }
  line("disk_capacity", format_size(o.disk_capacity_bytes));
  line("disk_write_budget_per_day", format_size(o.disk_write_budget_bytes_per_day));
  line("spill_on_shutdown", o.spill_on_shutdown ? "true" : "false");
  line("state_dir", o.state_directory.empty() ? "off" : o.state_directory);
  line("kept_memory_dir", o.kept_memory_directory.empty() ? "off" : o.kept_memory_directory);
  line("remote", o.remote.empty() ? "off" : o.remote);
  line("remote_user", o.remote_user.empty() ? "off" : o.remote_user);
  line("remote_password_file", o.remote_password_file.empty() ? "off" : o.remote_password_file);
  line("remote_write", o.remote_write);
  out += "# watchdog (from $WATCHDOG_USEC): " +
         (o.watchdog_usec == 0 ? std::string("off") : std::to_string(o.watchdog_usec) + " usec") +
         "\n";
  return out;
}

bool reread_options(const DaemonOptions& current, DaemonOptions& ret_options,
                    std::string& ret_error) {
  DaemonOptions o = default_options();
  o.config_path = current.config_path;
  o.config_path_explicit = current.config_path_explicit;
  o.flag_values = current.flag_values;
  if (!apply_config_file(o.config_path, o.config_path_explicit, o, ret_error)) return false;
  for (const auto& [key, value] : o.flag_values) {
    std::string error;
    if (!set_config_value(o, key, value, error)) {
      ret_error = "command line: " + error;
      return false;
    }
  }
  std::string warning;
  if (!finish_with_overrides(o, ret_error, warning)) return false;
  o.overrides_warning = warning;
  o.watchdog_usec = current.watchdog_usec;  // the environment of this process, not the file's
  ret_options = std::move(o);
  return true;
}

}  // namespace kvpark::daemon
