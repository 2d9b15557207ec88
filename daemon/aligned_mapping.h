// 2 MiB-aligned anonymous mappings: what the huge-page allocator (huge_page_allocator.h)
// and the kept memory (kept_memory.h) both map. It sits below both, so neither
// reaches into the other for it.
#pragma once

#include <cstddef>

namespace kvpark::daemon {

inline constexpr size_t huge_page_bytes = 2u << 20;

// A 2 MiB-aligned anonymous mapping of `size` bytes (a multiple of 2 MiB), not yet
// advised; nullptr when the kernel refuses.
void* map_aligned_anonymous(size_t size);

}  // namespace kvpark::daemon
