#include "daemon/aligned_mapping.h"

#include <sys/mman.h>

#include <cstdint>

namespace kvpark::daemon {

void* map_aligned_anonymous(size_t size) {
  // Map a page more than needed, then trim both ends to a 2 MiB boundary: mmap
  // aligns to 4 KiB only, and a huge page must lie on a 2 MiB boundary.
  void* raw = mmap(nullptr, size + huge_page_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + huge_page_bytes - 1) & ~uintptr_t{huge_page_bytes - 1};
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = begin + size + huge_page_bytes;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  return reinterpret_cast<void*>(aligned);
}

}  // namespace kvpark::daemon
