// Shared mappings that 2 MiB pages can back, for the arena and the state segment.
#pragma once

#include <cstdint>

namespace kvpark::shm {

inline constexpr uint64_t transparent_huge_page_bytes = 2ull * 1024 * 1024;

// Whether the kernel's policy lets shmem use transparent huge pages
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled is always, within_size, advise or
// force); a mapping still has to be aligned and advised MADV_HUGEPAGE under "advise".
bool shmem_transparent_allowed();

// Maps `bytes` of `fd` MAP_SHARED | `flags`, starting on an `alignment` boundary (so
// 2 MiB pages can back it); munmap(result, bytes) undoes it. nullptr with errno set on
// failure.
uint8_t* map_aligned(int fd, uint64_t bytes, uint64_t alignment, int prot, int flags);

}  // namespace kvpark::shm
