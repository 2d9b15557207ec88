// Best-fit extent allocator with coalescing (see extent_allocator.h).
#include "shm/extent_allocator.h"

#include <algorithm>
#include <bit>
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

void ExtentAllocator::adopt(const ExtentClaims& claims) {
  assert(claims.capacity_bytes_ == capacity_bytes_ &&
         claims.granularity_bytes_ == granularity_bytes_);
  by_offset_.clear();
  by_size_.clear();
  bytes_free_ = capacity_bytes_ - claims.claimed_bytes();
  for (uint64_t g = claims.next_with(false, 0); g < claims.granules_;) {
    const uint64_t end = claims.next_with(true, g);
    // Runs come in offset order: each goes at the end of by_offset_.
    by_offset_.emplace_hint(by_offset_.end(), g * granularity_bytes_, (end - g) * granularity_bytes_);
    by_size_.emplace((end - g) * granularity_bytes_, g * granularity_bytes_);
    g = claims.next_with(false, end);
  }
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

ExtentClaims::ExtentClaims(uint64_t capacity_bytes, uint64_t granularity_bytes)
    : capacity_bytes_(capacity_bytes),
      granularity_bytes_(granularity_bytes),
      granule_shift_(static_cast<unsigned>(std::countr_zero(granularity_bytes))),
      granules_(capacity_bytes / granularity_bytes),
      words_((granules_ + 63) / 64, 0) {
  assert(std::has_single_bit(granularity_bytes) && capacity_bytes % granularity_bytes == 0);
}

namespace {
// Bits [from, to) of one word, 0 <= from < to <= 64.
uint64_t bit_range(uint64_t from, uint64_t to) {
  const uint64_t high = to == 64 ? ~uint64_t{0} : (uint64_t{1} << to) - 1;
  return high & ~((uint64_t{1} << from) - 1);
}
}  // namespace

bool ExtentClaims::any_set(uint64_t first, uint64_t end) const {
  for (uint64_t g = first; g < end;) {
    const uint64_t word = g / 64, to = std::min<uint64_t>(end - word * 64, 64);
    if ((words_[word] & bit_range(g % 64, to)) != 0) return true;
    g = word * 64 + to;
  }
  return false;
}

void ExtentClaims::set(uint64_t first, uint64_t end, bool used) {
  for (uint64_t g = first; g < end;) {
    const uint64_t word = g / 64, to = std::min<uint64_t>(end - word * 64, 64);
    if (used) {
      words_[word] |= bit_range(g % 64, to);
    } else {
      words_[word] &= ~bit_range(g % 64, to);
    }
    g = word * 64 + to;
  }
  if (used) {
    claimed_granules_ += end - first;
  } else {
    claimed_granules_ -= end - first;
  }
}

uint64_t ExtentClaims::next_with(bool used, uint64_t from) const {
  for (uint64_t word = from / 64; word < words_.size(); ++word) {
    uint64_t bits = used ? words_[word] : ~words_[word];
    if (word == from / 64) bits &= bit_range(from % 64, 64);
    if (bits != 0) return std::min(word * 64 + static_cast<uint64_t>(__builtin_ctzll(bits)), granules_);
  }
  return granules_;
}

bool ExtentClaims::claim(uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || ((offset | bytes) & (granularity_bytes_ - 1)) != 0 ||
      offset > capacity_bytes_ || bytes > capacity_bytes_ - offset) {
    return false;
  }
  const uint64_t first = offset >> granule_shift_, end = first + (bytes >> granule_shift_);
  if (end - first <= 64 - first % 64) {
    // Within one word (most extents): one load, one store.
    uint64_t& word = words_[first / 64];
    const uint64_t bits = bit_range(first % 64, first % 64 + (end - first));
    if ((word & bits) != 0) return false;
    word |= bits;
    claimed_granules_ += end - first;
    return true;
  }
  if (any_set(first, end)) return false;
  set(first, end, true);
  return true;
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

}  // namespace kvpark::shm
