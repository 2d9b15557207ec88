// Latency of the remote tier's operations (an existence check, an entry restore, a
// write-behind), as the tier's worker measures them: its time on one job, the store's
// round trips and the copies (queueing excluded), in microseconds.
//
// Fixed buckets, finer than the disk tier's (a loopback or LAN round trip is tens of
// microseconds): bucket i counts observations in (bound[i-1], bound[i]], the last one
// every observation above the largest bound. Percentiles are read from the buckets as
// an upper bound: the bound of the bucket that holds the rank, or the largest
// observation when that is smaller (so one observation reads exactly, and the overflow
// bucket reads as the largest observation). Plain values, copied into status.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace kvpark::daemon {

// Upper bounds of the buckets, microseconds, increasing.
inline constexpr uint64_t remote_latency_bounds_usec[] = {
    50,     100,     250,     500,     1'000,     2'500,     5'000,     10'000,    25'000,
    50'000, 100'000, 250'000, 500'000, 1'000'000, 2'500'000, 5'000'000, 10'000'000};

struct RemoteLatencyHistogram {
  static constexpr size_t bounded_buckets = std::size(remote_latency_bounds_usec);
  static constexpr size_t bucket_count = bounded_buckets + 1;  // the last: above every bound

  uint64_t buckets[bucket_count] = {};  // observations per bucket (not cumulative)
  uint64_t count = 0;
  uint64_t sum_usec = 0;
  uint64_t max_usec = 0;

  void observe(uint64_t usec) {
    size_t i = 0;
    while (i < bounded_buckets && usec > remote_latency_bounds_usec[i]) ++i;
    ++buckets[i];
    ++count;
    sum_usec += usec;
    if (usec > max_usec) max_usec = usec;
  }

  // Observations <= remote_latency_bounds_usec[i] (i < bounded_buckets), or all of
  // them (i == bounded_buckets): Prometheus' `le` buckets.
  uint64_t cumulative(size_t i) const {
    assert(i < bucket_count);
    uint64_t total = 0;
    for (size_t b = 0; b <= i; ++b) total += buckets[b];
    return total;
  }

  uint64_t mean_usec() const { return count == 0 ? 0 : sum_usec / count; }

  // An upper bound of the `percent`-th percentile (1..100): the ceil(count * percent /
  // 100)-th smallest observation is at most this. 0 when empty.
  uint64_t percentile_usec(uint32_t percent) const {
    assert(percent >= 1 && percent <= 100);
    if (count == 0) return 0;
    const uint64_t rank = (count * percent + 99) / 100;  // 1-based
    uint64_t seen = 0;
    for (size_t i = 0; i < bounded_buckets; ++i) {
      seen += buckets[i];
      if (seen >= rank)
        return remote_latency_bounds_usec[i] < max_usec ? remote_latency_bounds_usec[i] : max_usec;
    }
    return max_usec;  // the overflow bucket
  }
};

// Percentiles a status shows (what an operator reads; /metrics has the buckets).
inline constexpr uint32_t remote_latency_status_percentiles[] = {50, 99};

// One histogram's status figures, as flat keys: `<name>_timed` (observations),
// `<name>_usec_mean`, `<name>_usec_p50`, `<name>_usec_p99`, `<name>_usec_max`.
inline void append_latency_figures(const std::string& name, const RemoteLatencyHistogram& h,
                                   std::vector<std::pair<std::string, uint64_t>>& ret) {
  ret.emplace_back(name + "_timed", h.count);
  ret.emplace_back(name + "_usec_mean", h.mean_usec());
  for (uint32_t p : remote_latency_status_percentiles) {
    ret.emplace_back(name + "_usec_p" + std::to_string(p), h.percentile_usec(p));
  }
  ret.emplace_back(name + "_usec_max", h.max_usec);
}

// Bounds increase, so every observation has exactly one bucket.
constexpr bool remote_latency_bounds_increase() {
  for (size_t i = 1; i < std::size(remote_latency_bounds_usec); ++i) {
    if (remote_latency_bounds_usec[i - 1] >= remote_latency_bounds_usec[i]) return false;
  }
  return true;
}
static_assert(remote_latency_bounds_increase());

constexpr bool remote_latency_has_bound(uint64_t usec) {
  for (uint64_t b : remote_latency_bounds_usec) {
    if (b == usec) return true;
  }
  return false;
}

}  // namespace kvpark::daemon
