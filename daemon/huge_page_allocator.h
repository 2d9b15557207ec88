// Memory for the entry table's large structures, on transparent huge pages where the
// kernel allows it (madvise mode or always).
//
// Why: an index of 1M entries is a quarter of a gigabyte, built in one go at adoption
// (and grown the same way under load). On the VMs kvpark runs on, first-touching a
// 4 KiB page of fresh anonymous memory costs 15-60 us (a nested page-table fault),
// so such an index costs seconds in faults alone; on 2 MiB pages it costs tens of
// milliseconds. HugePageAllocator<T> serves arrays: an allocation of at least
// huge_allocation_bytes_min is its own 2 MiB-aligned mapping advised MADV_HUGEPAGE;
// smaller ones use operator new.
// Where the kernel has no huge page to give (THP off, fragmentation), the same mappings
// are simply 4 KiB pages: a slower first touch, nothing else changes.
// Under a service manager the mappings come from memory kept in its fd store instead
// (kept_memory.h), which a restarted daemon finds already backed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "daemon/aligned_mapping.h"  // huge_page_bytes, map_aligned_anonymous

namespace kvpark::daemon {

inline constexpr size_t huge_allocation_bytes_min = huge_page_bytes;  // smaller: operator new

// A 2 MiB-aligned mapping of `bytes` (rounded up to 2 MiB), advised MADV_HUGEPAGE:
// from the kept memory when one is in use and has room, else anonymous; throws
// std::bad_alloc when the kernel refuses.
void* map_huge_pages(size_t bytes);
void unmap_huge_pages(void* p, size_t bytes);

// Set on a thread while it sizes arrays over contents they already hold (adopting an
// index image, index_image.cpp): value-initialisation (vector::resize) then leaves each
// element's memory as it is.
inline thread_local bool keep_contents_on_resize = false;

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  T* allocate(size_t n) {
    static_assert(alignof(T) <= alignof(std::max_align_t), "operator new's alignment is the floor");
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = n * sizeof(T);
    if (bytes >= huge_allocation_bytes_min) return static_cast<T*>(map_huge_pages(bytes));
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes >= huge_allocation_bytes_min) {
      unmap_huge_pages(p, bytes);
    } else {
      ::operator delete(p);
    }
  }
  template <typename U>
  void construct(U* p) {
    if (!keep_contents_on_resize) ::new (static_cast<void*>(p)) U();
  }
  template <typename U, typename A0, typename... A>
  void construct(U* p, A0&& first, A&&... rest) {
    ::new (static_cast<void*>(p)) U(std::forward<A0>(first), std::forward<A>(rest)...);
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;  // stateless: memory from one is freed by any
  }
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace kvpark::daemon
