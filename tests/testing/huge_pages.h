// Reserved huge pages on this machine (vm.nr_hugepages), for tests whose hugetlb cases
// run only where some are free: tests never change the sysctl.
#pragma once

#include <cstdint>
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

}  // namespace kvpark::testing
