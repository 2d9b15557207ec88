// Shared mappings that 2 MiB pages can back, for the arena and the state segment.
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::shm {

inline constexpr uint64_t transparent_huge_page_bytes = 2ull * 1024 * 1024;

// Whether the kernel's policy lets shmem use transparent huge pages
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled is always, within_size, advise or
// force); a mapping still has to be aligned and advised MADV_HUGEPAGE under "advise".
bool shmem_transparent_allowed();

// A new unnamed file (O_TMPFILE, mode 0600, close-on-exec) in `directory`, which must be
// on tmpfs: there a mount option (huge=within_size) gives its pages 2 MiB whatever
// shmem_enabled says, where a memfd's follow shmem_enabled. -1 with errno set when it
// cannot be made (ENOTSUP when `directory` is on another file system).
int create_tmpfs_file(const std::string& directory);

// Bytes of the mapping starting at `base` that the kernel maps with PMD (2 MiB) shmem
// pages (its ShmemPmdMapped in /proc/self/smaps): what the kernel gave, not what it was
// asked; 0 when none, or no mapping starts there.
uint64_t shmem_pmd_mapped_bytes(const void* base);

// Maps `bytes` of `fd` MAP_SHARED | `flags`, starting on an `alignment` boundary (so
// 2 MiB pages can back it); munmap(result, bytes) undoes it. nullptr with errno set on
// failure.
uint8_t* map_aligned(int fd, uint64_t bytes, uint64_t alignment, int prot, int flags);

}  // namespace kvpark::shm
