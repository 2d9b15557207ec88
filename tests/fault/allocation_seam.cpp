// The replaced global operator new and delete of allocation_seam.h. A translation unit
// of its own, so the compiler never sees malloc and a new-expression's delete together.
#include "tests/fault/allocation_seam.h"

#include <cstdlib>
#include <new>

namespace {

thread_local long allocations_before_failure = -1;  // -1: never fail
thread_local bool allocation_failed = false;

}  // namespace

namespace kvpark::testing {

void arm_allocation_failure(long allocations) {
  allocation_failed = false;
  allocations_before_failure = allocations;
}

bool disarm_allocation_failure() {
  allocations_before_failure = -1;
  return allocation_failed;
}

}  // namespace kvpark::testing

void* operator new(std::size_t bytes) {
  if (allocations_before_failure >= 0 && allocations_before_failure-- == 0) {
    allocation_failed = true;
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t bytes) { return operator new(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
