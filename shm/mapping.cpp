// Aligned shared mappings and the kernel's shmem huge-page policy (see mapping.h).
#include "shm/mapping.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace kvpark::shm {

bool shmem_transparent_allowed() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t open = text.find('['), close = text.find(']');  // the bracketed word
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  const std::string mode = text.substr(open + 1, close - open - 1);
  return mode == "always" || mode == "within_size" || mode == "advise" || mode == "force";
}

int create_tmpfs_file(const std::string& directory) {
  struct statfs fs {};
  if (statfs(directory.c_str(), &fs) != 0) return -1;
  if (fs.f_type != TMPFS_MAGIC) {
    errno = ENOTSUP;
    return -1;
  }
  return open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
}

uint64_t shmem_pmd_mapped_bytes(const void* base) {
  std::ifstream in("/proc/self/smaps");
  char start[32];
  std::snprintf(start, sizeof start, "%lx-", reinterpret_cast<unsigned long>(base));
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.find('-') != std::string::npos && line.find(' ') != std::string::npos &&
        std::isxdigit(static_cast<unsigned char>(line[0])) && line.find(':') > line.find(' ')) {
      inside = line.rfind(start, 0) == 0;
      continue;
    }
    if (inside && line.rfind("ShmemPmdMapped:", 0) == 0) {
      std::istringstream fields(line.substr(15));
      uint64_t kib = 0;
      fields >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

uint8_t* map_aligned(int fd, uint64_t bytes, uint64_t alignment, int prot, int flags) {
  // A window larger by one alignment unit, then the file over its aligned part: mmap
  // aligns to 4 KiB only.
  const uint64_t reserve = bytes + alignment;
  void* r = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return nullptr;
  auto* base = static_cast<uint8_t*>(r);
  const uint64_t at = reinterpret_cast<uint64_t>(base);
  auto* aligned = reinterpret_cast<uint8_t*>((at + alignment - 1) / alignment * alignment);
  void* m = mmap(aligned, bytes, prot, MAP_SHARED | MAP_FIXED | flags, fd, 0);
  if (m == MAP_FAILED) {
    const int err = errno;
    munmap(base, reserve);
    errno = err;
    return nullptr;
  }
  // Give back the slack on both sides: what is left is exactly the mapping.
  if (aligned > base) munmap(base, aligned - base);
  if (base + reserve > aligned + bytes) munmap(aligned + bytes, base + reserve - (aligned + bytes));
  return aligned;
}

}  // namespace kvpark::shm
