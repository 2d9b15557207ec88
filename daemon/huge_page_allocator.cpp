// Huge-page mappings (see huge_page_allocator.h).
#include "daemon/huge_page_allocator.h"

#include <sys/mman.h>

#include "daemon/kept_memory.h"

namespace kvpark::daemon {
namespace {

size_t rounded(size_t bytes) {
  return (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes;
}

}  // namespace

void* map_huge_pages(size_t bytes) {
  if (KeptMemory* kept = kept_memory_in_use(); kept != nullptr) {
    if (void* p = kept->map(bytes); p != nullptr) return p;
  }
  const size_t size = rounded(bytes);
  void* p = map_aligned_anonymous(size);
  if (p == nullptr) throw std::bad_alloc();
  // Best effort: with THP off or unavailable the mapping stays on 4 KiB pages.
  (void)madvise(p, size, MADV_HUGEPAGE);
  return p;
}

void unmap_huge_pages(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (KeptMemory* kept = kept_memory_in_use(); kept != nullptr && kept->unmap(p)) return;
  munmap(p, rounded(bytes));
}

}  // namespace kvpark::daemon
