// Best-fit extent allocator with coalescing (see extent_allocator.h).
#include "shm/extent_allocator.h"

#include <cassert>
#include <iterator>

namespace kvpark::shm {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t granularity_bytes)
    : capacity_bytes_(capacity_bytes),
      granularity_bytes_(granularity_bytes),
      bytes_free_(capacity_bytes) {
  assert(granularity_bytes > 0 && capacity_bytes % granularity_bytes == 0);
  if (capacity_bytes > 0) insert_run(0, capacity_bytes);
}

void ExtentAllocator::insert_run(uint64_t offset, uint64_t bytes) {
  by_offset_.emplace(offset, bytes);
  by_size_.emplace(bytes, offset);
}

void ExtentAllocator::erase_run(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

bool ExtentAllocator::allocate(uint64_t bytes, uint64_t& ret_offset) {
  assert(bytes > 0 && bytes % granularity_bytes_ == 0);
  auto fit = by_size_.lower_bound({bytes, 0});
  if (fit == by_size_.end()) return false;
  const auto [run_bytes, run_offset] = *fit;
  erase_run(by_offset_.find(run_offset));
  if (run_bytes > bytes) insert_run(run_offset + bytes, run_bytes - bytes);
  bytes_free_ -= bytes;
  ret_offset = run_offset;
  return true;
}

bool ExtentAllocator::claim(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || bytes % granularity_bytes_ != 0 || offset % granularity_bytes_ != 0 ||
      offset > capacity_bytes_ || bytes > capacity_bytes_ - offset) {
    return false;
  }
  auto run = by_offset_.upper_bound(offset);
  if (run == by_offset_.begin()) return false;
  --run;
  const auto [run_offset, run_bytes] = *run;
  if (offset + bytes > run_offset + run_bytes) return false;  // not wholly free
  erase_run(run);
  if (offset > run_offset) insert_run(run_offset, offset - run_offset);
  if (offset + bytes < run_offset + run_bytes) {
    insert_run(offset + bytes, run_offset + run_bytes - offset - bytes);
  }
  bytes_free_ -= bytes;
  return true;
}

void ExtentAllocator::free(uint64_t offset, uint64_t bytes) {
  assert(bytes > 0 && bytes % granularity_bytes_ == 0 && offset % granularity_bytes_ == 0);
  assert(offset + bytes <= capacity_bytes_);
  uint64_t start = offset;
  uint64_t end = offset + bytes;
  auto next = by_offset_.lower_bound(offset);
  // Freeing over a free run means a double free or a foreign extent: a bug.
  assert(next == by_offset_.end() || next->first >= end);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    assert(prev->first + prev->second <= start);
    if (prev->first + prev->second == start) {
      start = prev->first;
      erase_run(prev);
    }
  }
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    erase_run(next);
  }
  insert_run(start, end - start);
  bytes_free_ += bytes;
  assert(bytes_free_ <= capacity_bytes_);
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace kvpark::shm
