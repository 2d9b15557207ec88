// Daemon-side allocator of arena extents.
//
// Model: the data region is a line of extent_align_bytes granules. Free space is a
// set of maximal free runs, indexed by offset (for coalescing) and by size (for
// best fit). allocate() takes the smallest run that fits and carves from its low
// end; free() merges the run with free neighbours, so two adjacent free runs never
// exist. Fragmentation is therefore external only and bounded by the mix of sizes:
// a workload of equal-sized blocks never fragments; mixed sizes can leave holes
// smaller than a large request, which eviction then frees (largest_free_bytes()
// reports the biggest contiguous run). All operations are O(log runs).
// An adopted arena's allocation is rebuilt in one pass: ExtentClaims takes the kept
// extents in any order (one bit per granule, refusing overlaps), then adopt() makes
// every granule no claim covers free, O(granules / 64 + runs).
// Not thread-safe: the daemon's event loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace kvpark::shm {

// The extents an adoption keeps, one bit per granule of the data region.
class ExtentClaims {
 public:
  // granularity_bytes is a power of two.
  ExtentClaims(uint64_t capacity_bytes, uint64_t granularity_bytes);
  // Takes [offset, offset+bytes) when it lies inside the region, on granules, and
  // overlaps nothing claimed before; false, nothing changed, otherwise.
  bool claim(uint64_t offset, uint64_t bytes);
  uint64_t claimed_bytes() const { return claimed_granules_ * granularity_bytes_; }

 private:
  friend class ExtentAllocator;
  bool any_set(uint64_t first, uint64_t end) const;  // granules [first, end)
  void set(uint64_t first, uint64_t end, bool used);
  uint64_t next_with(bool used, uint64_t from) const;  // the first such granule at or past `from`

  uint64_t capacity_bytes_;
  uint64_t granularity_bytes_;
  unsigned granule_shift_;  // log2 of granularity_bytes_
  uint64_t granules_;
  uint64_t claimed_granules_ = 0;
  std::vector<uint64_t> words_;
};

class ExtentAllocator {
 public:
  // capacity_bytes and every size are multiples of granularity_bytes.
  ExtentAllocator(uint64_t capacity_bytes, uint64_t granularity_bytes);

  // Returns false (ret_offset untouched) when no free run holds `bytes`.
  bool allocate(uint64_t bytes, uint64_t& ret_offset);
  // Replaces the whole state: what `claims` covers is allocated, the rest free.
  void adopt(const ExtentClaims& claims);
  // Returns an extent obtained from allocate(); freeing anything else is a bug.
  void free(uint64_t offset, uint64_t bytes);

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t bytes_free() const { return bytes_free_; }
  uint64_t bytes_used() const { return capacity_bytes_ - bytes_free_; }
  uint64_t largest_free_bytes() const;
  size_t free_runs() const { return by_offset_.size(); }
  // Calls f(offset, bytes) for each free run, in offset order.
  template <typename F>
  void for_each_free_run(F&& f) const {
    for (const auto& [offset, bytes] : by_offset_) f(offset, bytes);
  }
  uint64_t granularity_bytes() const { return granularity_bytes_; }

 private:
  void insert_run(uint64_t offset, uint64_t bytes);
  void erase_run(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_bytes_;
  uint64_t granularity_bytes_;
  uint64_t bytes_free_;
  std::map<uint64_t, uint64_t> by_offset_;             // offset -> bytes
  std::set<std::pair<uint64_t, uint64_t>> by_size_;    // (bytes, offset)
};

}  // namespace kvpark::shm
