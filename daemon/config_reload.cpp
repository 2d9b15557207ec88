// kvparkd's runtime overrides (limits changed with set-limit, kept in the state
// directory and applied over kvparkd.conf and the command line) and `reload config`
// (see config.h).
#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "daemon/config.h"
#include "daemon/config_keys.h"
#include "daemon/disk_tier.h"
#include "daemon/durable_file.h"
#include "daemon/log.h"
#include "daemon/park.h"
#include "proto/size.h"

namespace kvpark::daemon {

using config_detail::config_keys;
using config_detail::KeyInfo;
using config_detail::limit_keys;
using config_detail::trim;

std::string runtime_overrides_path(const DaemonOptions& o) {
  return o.state_directory.empty() ? std::string()
                                   : o.state_directory + "/" + runtime_overrides_file_name;
}

const char* limit_config_key(std::string_view limit_name) {
  for (const auto& [limit, key] : limit_keys) {
    if (limit_name == limit) return key;
  }
  return nullptr;
}

bool finish_with_overrides(DaemonOptions& o, std::string& ret_error, std::string& ret_warning) {
  ret_warning.clear();
  o.override_values.clear();
  const std::string path = runtime_overrides_path(o);
  DaemonOptions with = o;
  std::ifstream in(path);
  if (path.empty() || !in) {
    const int err = errno;
    if (!path.empty() && err != ENOENT) {
      ret_warning = path + ": cannot read: " + strerror(err) + "; runtime overrides not applied";
    }
    return finish_options(o, ret_error);
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string error;
  bool usable = apply_config_text(buffer.str(), path, with, error);
  // Only keys set-limit sets, each once (apply_config_text refused duplicates).
  std::istringstream lines(buffer.str());
  for (std::string line; usable && std::getline(lines, line);) {
    const std::string_view text = trim(line);
    if (text.empty() || text.front() == '#' || text.front() == ';') continue;
    const std::string key(trim(text.substr(0, text.find('='))));
    const bool allowed = std::any_of(std::begin(limit_keys), std::end(limit_keys),
                                     [&](const auto& k) { return key == k.second; });
    if (!allowed) {
      error = path + ": '" + key + "' is not a limit set-limit sets";
      usable = false;
      break;
    }
    with.override_values.emplace_back(key, std::string(trim(text.substr(text.find('=') + 1))));
  }
  if (usable && !finish_options(with, error)) {
    error = path + ": " + error;
    usable = false;
  }
  if (!usable) {
    ret_warning = error + "; runtime overrides not applied (remove the file to silence this)";
    with.override_values.clear();
    return finish_options(o, ret_error);
  }
  o = std::move(with);
  return true;
}

void keep_limit_change(DaemonOptions& current, const LimitChange& change) {
  const char* key = limit_config_key(change.name);
  assert(key != nullptr && "a limit set-limit applied has a config key");
  const std::string value = format_size(change.new_value);
  std::string ignored;
  set_config_value(current, key, value, ignored);  // the text of a value it just printed
  auto& values = current.override_values;
  const auto it = std::find_if(values.begin(), values.end(),
                               [&](const auto& kv) { return kv.first == key; });
  if (it != values.end()) {
    it->second = value;
  } else {
    values.emplace_back(key, value);
  }
  const std::string path = runtime_overrides_path(current);
  std::string kept;
  if (path.empty()) {
    kept = "not kept across a restart: state_dir is off";
  } else if (write_runtime_overrides(path, values)) {
    kept = "kept in " + path;
  } else {
    kept = "NOT kept across a restart: cannot write " + path + ": " + strerror(errno);
  }
  log_at(path.empty() || kept.front() != 'N' ? 5 : 3,
         "kvparkd: limit %s changed from %s to %s by %s; %s", change.name.c_str(),
         format_size(change.old_value).c_str(), value.c_str(),
         change.caller.empty() ? "an unnamed caller" : change.caller.c_str(), kept.c_str());
}

bool write_runtime_overrides(const std::string& path,
                             const std::vector<std::pair<std::string, std::string>>& values) {
  const std::filesystem::path file(path);
  std::error_code ec;
  std::filesystem::create_directories(file.parent_path(), ec);
  std::string text =
      "# kvparkd runtime overrides: limits changed with kvparkctl set-limit, applied at\n"
      "# start and reload after kvparkd.conf and the command line (kvparkd.conf(5)).\n"
      "# Written by kvparkd; to go back to the configured values, remove this file and\n"
      "# run kvparkctl reload.\n";
  for (const auto& [key, value] : values) text += key + " = " + value + "\n";
  return replace_file_durably(path, text);
}

Status reload_options(DaemonOptions& current, Park& park, std::string& ret_message) {
  DaemonOptions next;
  std::string error;
  if (!reread_options(current, next, error)) {
    ret_message = "not reloaded: " + error;
    return Status::InvalidArgument;
  }
  std::string applied;
  std::string restart;
  const std::string before = format_config(current);
  const std::string after = format_config(next);
  // Compare key by key: the printed form is the canonical one.
  const auto key_lines = [](const std::string& text) {
    std::vector<std::pair<std::string, std::string>> out;  // key, line; in key order
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line.front() != '#') out.emplace_back(line.substr(0, line.find(' ')), line);
    }
    return out;
  };
  const auto before_keys = key_lines(before);
  const auto after_keys = key_lines(after);
  for (size_t i = 0; i < before_keys.size() && i < after_keys.size(); ++i) {
    const std::string& a = before_keys[i].second;
    const std::string& b = after_keys[i].second;
    if (a == b) continue;
    const std::string& key = before_keys[i].first;
    const auto* info = std::find_if(std::begin(config_keys), std::end(config_keys),
                                    [&](const KeyInfo& k) { return key == k.name; });
    if (info != std::end(config_keys) && info->runtime) {
      applied += (applied.empty() ? "" : ", ") + b;
    } else {
      restart += (restart.empty() ? "" : ", ") + key;
    }
  }
  // Only what changed: the daemon may have derived a value from the old one
  // (a disk tier's default low water), which an unchanged key must not undo.
  if (next.arena_low_water_bytes != current.arena_low_water_bytes) {
    park.set_low_water_bytes(next.arena_low_water_bytes);
    park.tick();
  }
  if (next.reservation_bytes_max != current.reservation_bytes_max) {
    park.set_reservation_bytes_max(next.reservation_bytes_max);
  }
  if (DiskTier* disk = park.disk()) {
    if (next.disk_capacity_bytes != current.disk_capacity_bytes) {
      disk->set_capacity_bytes(next.disk_capacity_bytes);
      park.tick();
    }
    if (next.disk_write_budget_bytes_per_day != current.disk_write_budget_bytes_per_day) {
      disk->set_write_budget_bytes_per_day(next.disk_write_budget_bytes_per_day);
    }
  }
  current.reservation_bytes_max = next.reservation_bytes_max;
  current.arena_low_water_bytes = next.arena_low_water_bytes;
  current.arena_low_water_set = next.arena_low_water_set;
  current.disk_capacity_bytes = next.disk_capacity_bytes;
  current.disk_write_budget_bytes_per_day = next.disk_write_budget_bytes_per_day;
  current.spill_on_shutdown = next.spill_on_shutdown;
  current.config_file_read = next.config_file_read;
  current.override_values = next.override_values;
  current.overrides_warning = next.overrides_warning;
  // Never claim a file was read that is not there (a missing default file means defaults).
  ret_message = (next.config_file_read
                     ? "reloaded " + current.config_path
                     : "no configuration file at " + current.config_path +
                           ": re-applied the defaults and the command line") +
                ": " + (applied.empty() ? "nothing changed" : "applied " + applied);
  if (!restart.empty()) ret_message += "; needs a restart: " + restart;
  if (!next.overrides_warning.empty()) ret_message += "; " + next.overrides_warning;
  return Status::Ok;
}

}  // namespace kvpark::daemon
