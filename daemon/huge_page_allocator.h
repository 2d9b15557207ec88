// Memory for the entry table's large structures, on transparent huge pages where the
// kernel allows it (madvise mode or always).
//
// Why: an index of 1M entries is a quarter of a gigabyte, built in one go at adoption
// (and grown the same way under load). On the VMs kvpark runs on, first-touching a
// 4 KiB page of fresh anonymous memory costs 15-60 us (a nested page-table fault),
// so such an index costs seconds in faults alone; on 2 MiB pages it costs tens of
// milliseconds. Two users:
//  - HugePageAllocator<T> for arrays: an allocation of at least huge_allocation_bytes_min
//    is its own 2 MiB-aligned mapping advised MADV_HUGEPAGE; smaller ones use operator new;
//  - with a NodePool, single objects (hash-map nodes) are carved from 2 MiB chunks of
//    the same kind and reused through a free list; the chunks go with the pool.
// Where the kernel has no huge page to give (THP off, fragmentation), the same mappings
// are simply 4 KiB pages: a slower first touch, nothing else changes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

namespace kvpark::daemon {

inline constexpr size_t huge_page_bytes = 2u << 20;
inline constexpr size_t huge_allocation_bytes_min = huge_page_bytes;  // smaller: operator new
inline constexpr size_t pool_object_bytes_max = 256;                  // larger: not pooled
inline constexpr size_t pool_granule_bytes = 16;                      // size classes, and alignment

// A 2 MiB-aligned anonymous mapping of `bytes` (rounded up to 2 MiB), advised
// MADV_HUGEPAGE; throws std::bad_alloc when the kernel refuses.
void* map_huge_pages(size_t bytes);
void unmap_huge_pages(void* p, size_t bytes);

// Single objects of up to pool_object_bytes_max, from huge-page chunks. Not thread-safe:
// one owner (the entry table, on the daemon's loop thread).
class NodePool {
 public:
  NodePool() = default;
  ~NodePool();
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  void* allocate(size_t bytes);
  void deallocate(void* p, size_t bytes) noexcept;
  size_t chunk_bytes() const { return chunks_.size() * huge_page_bytes; }

 private:
  struct FreeObject {
    FreeObject* next;
  };
  static size_t size_class(size_t bytes) { return (bytes + pool_granule_bytes - 1) / pool_granule_bytes; }
  std::array<FreeObject*, pool_object_bytes_max / pool_granule_bytes + 1> free_{};
  std::vector<void*> chunks_;
  uint8_t* next_ = nullptr;  // the rest of the newest chunk
  size_t left_ = 0;
};

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;
  HugePageAllocator() noexcept = default;
  explicit HugePageAllocator(NodePool* pool) noexcept : pool_(pool) {}
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>& other) noexcept : pool_(other.pool()) {}

  T* allocate(size_t n) {
    static_assert(alignof(T) <= pool_granule_bytes, "pooled and huge-page memory is 16-byte aligned");
    const size_t bytes = n * sizeof(T);
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    if (n == 1 && pool_ != nullptr && bytes <= pool_object_bytes_max) {
      return static_cast<T*>(pool_->allocate(bytes));
    }
    if (bytes >= huge_allocation_bytes_min) return static_cast<T*>(map_huge_pages(bytes));
    return static_cast<T*>(::operator new(bytes));
  }
  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (n == 1 && pool_ != nullptr && bytes <= pool_object_bytes_max) {
      pool_->deallocate(p, bytes);
    } else if (bytes >= huge_allocation_bytes_min) {
      unmap_huge_pages(p, bytes);
    } else {
      ::operator delete(p);
    }
  }
  NodePool* pool() const noexcept { return pool_; }
  template <typename U>
  bool operator==(const HugePageAllocator<U>& other) const noexcept {
    return pool_ == other.pool();
  }

 private:
  NodePool* pool_ = nullptr;
};

template <typename T>
using HugePageVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace kvpark::daemon
