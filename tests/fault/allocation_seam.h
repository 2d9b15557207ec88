// A fault seam at the allocator: the test binary that links allocation_seam.cpp
// replaces the global operator new, which fails on demand for the calling thread
// only (other threads, and other processes, allocate as usual).
#pragma once

namespace kvpark::testing {

// The allocation `allocations` from now (0: the next one) throws std::bad_alloc.
void arm_allocation_failure(long allocations);
// Disarms; true when the armed failure happened since arm_allocation_failure().
bool disarm_allocation_failure();

}  // namespace kvpark::testing
