// The config file's keys, shared by its parser (config.cpp) and its reload and runtime
// overrides (config_reload.cpp): which keys there are, which a reload applies, which a
// set-limit changes. Private to those two.
#pragma once

#include <string_view>
#include <utility>

#include "daemon/control.h"

namespace kvpark::daemon::config_detail {

// Every key, in --print-config order. `runtime`: reload applies it without a restart.
struct KeyInfo {
  const char* name;
  bool runtime;
};
inline constexpr KeyInfo config_keys[] = {
    {"socket", false},
    {"arena_size", false},
    {"arena_name", false},
    {"huge_pages", false},
    {"reservation_max", true},
    {"unsealed_per_connection", false},
    {"unsealed_per_uid", false},
    {"arena_low_water", true},
    {"attach_group", false},
    {"admin_group", false},
    {"http_listen", false},
    {"http_allow_remote", false},
    {"dbus", false},
    {"disk_dir", false},
    {"disk_capacity", true},
    {"disk_write_budget_per_day", true},
    {"spill_on_shutdown", true},
    {"state_dir", false},
    {"kept_memory_dir", false},
    {"remote", false},
    {"remote_user", false},
    {"remote_password_file", false},
    {"remote_write", false},
};

// set-limit names and the keys they change; only these may be in the overrides file.
inline constexpr std::pair<const char*, const char*> limit_keys[] = {
    {limit_arena_low_water, "arena_low_water"},
    {limit_reservation_max, "reservation_max"},
    {limit_disk_capacity, "disk_capacity"},
    {limit_disk_write_budget, "disk_write_budget_per_day"},
};

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

}  // namespace kvpark::daemon::config_detail
