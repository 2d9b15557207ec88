// One field of the mapping that holds an address, from /proc/self/smaps (tests that
// check which pages a mapping has, or whether it may take huge pages).
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

namespace kvpark::testing {

// What follows `field` (e.g. "Rss:", "VmFlags:") in the smaps entry of the mapping
// holding p; nullopt when no mapping holds it or it has no such field.
inline std::optional<std::string> smaps_text(const void* p, const std::string& field) {
  std::ifstream in("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    uintptr_t begin = 0, end = 0;
    // A mapping's first line is "begin-end perms ..."; field lines are "Name: value".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find('-')) {
      inside = at >= begin && at < end;
    } else if (inside && line.rfind(field, 0) == 0) {
      return line.substr(field.size());
    }
  }
  return std::nullopt;
}

// The number after `field` (e.g. "Rss:", "THPeligible:"), as smaps_text finds it.
inline std::optional<uint64_t> smaps_field(const void* p, const std::string& field) {
  const std::optional<std::string> text = smaps_text(p, field);
  if (!text) return std::nullopt;
  return std::stoull(*text);
}

// Whether the mapping holding p is advised MADV_HUGEPAGE ("hg" in its VmFlags).
inline bool smaps_advised_huge(const void* p) {
  return smaps_text(p, "VmFlags:").value_or("").find(" hg") != std::string::npos;
}

}  // namespace kvpark::testing
