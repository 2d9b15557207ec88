// The daemon's accesses to arena memory, made safe against pages a client took away.
//
// The seals stop every client from resizing the arena, but not from punching holes
// (fallocate PUNCH_HOLE needs only a writable fd, and the arena must be writable).
// On shmem a hole reads as zeros and refills on write. On a hugetlb arena a hole is
// refilled from the reserved pool, and a client can empty that pool first (a
// writable mapping past the end of a hugetlb memfd extends it, and touching it takes
// pages): the daemon's next access to the hole would then be SIGBUS. Every access
// the daemon makes to the arena (entry headers and tokens; payloads only through
// io_uring, where a missing page is EFAULT) goes through these, which turn that
// SIGBUS into a failed access: the entry is treated as corrupt, the daemon lives.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvpark::shm {

// Installs the SIGBUS handler for [base, base + bytes). Faults elsewhere keep the
// default action (a core dump: a bug). Call once; before it, the accesses below
// run unguarded.
void guard_arena(const uint8_t* base, uint64_t bytes);

// memcpy that returns false instead of dying when a page of the arena is gone.
bool guarded_copy(void* dst, const void* src, size_t count);

// memcmp == 0 with the same guard; false when unequal or when a page is gone.
bool guarded_equal(const void* a, const void* b, size_t count);

// How many guarded accesses failed since start (for status).
uint64_t arena_faults();

}  // namespace kvpark::shm
