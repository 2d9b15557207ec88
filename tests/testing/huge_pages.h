// Reserved huge pages on this machine (vm.nr_hugepages), for tests whose hugetlb cases
// run only where some are free: tests never change the sysctl.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace kvpark::testing {

// A field of /proc/meminfo ("HugePages_Free"), 0 when absent.
inline uint64_t meminfo_field(const std::string& name) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == name + ":") return value;
    in.ignore(1 << 10, '\n');
  }
  return 0;
}

inline uint64_t free_huge_pages() {
  return meminfo_field("HugePages_Free");
}

// A line of /proc/self/smaps for the mapping that starts at `base`, after its "Key:"
// ("VmFlags", "ShmemPmdMapped"); empty when there is none.
inline std::string smaps_line(const void* base, const std::string& key) {
  std::ifstream in("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(base));
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':'), space = line.find(' ');
    if (space != std::string::npos && (colon == std::string::npos || colon > space)) {
      inside = line.rfind(start, 0) == 0;  // a mapping's own line: "begin-end perms ..."
      continue;
    }
    if (inside && line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 1);
  }
  return {};
}

}  // namespace kvpark::testing
