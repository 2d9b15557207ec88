// A latency distribution over fixed buckets whose bounds are a parameter: the disk
// tier's (one entry spilled or restored: 0.5 ms .. 10 s) and the remote tier's (its
// worker's time on one job, queueing excluded; finer, since a loopback or LAN round trip
// is tens of microseconds). Observations are microseconds.
//
// Bucket i counts observations in (bound[i-1], bound[i]], the last one every
// observation above the largest bound. Percentiles are read from the buckets as an
// upper bound: the bound of the bucket that holds the rank, or the largest observation
// when that is smaller (so one observation reads exactly, and the overflow bucket reads
// as the largest observation). Plain values, copied into status; /metrics writes every
// such histogram the same way (cumulative `le` buckets in exact decimal seconds).
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace kvpark::daemon {

// Upper bounds of the buckets, microseconds, increasing (checked below).
inline constexpr uint64_t disk_latency_bounds_usec[] = {
    500,     1'000,   2'500,     5'000,     10'000,    25'000,    50'000,
    100'000, 250'000, 500'000, 1'000'000, 2'500'000, 5'000'000, 10'000'000};
inline constexpr uint64_t remote_latency_bounds_usec[] = {
    50,     100,     250,     500,     1'000,     2'500,     5'000,     10'000,    25'000,
    50'000, 100'000, 250'000, 500'000, 1'000'000, 2'500'000, 5'000'000, 10'000'000};

template <const auto& Bounds>
struct LatencyHistogram {
  static constexpr const auto& bounds_usec = Bounds;
  static constexpr size_t bounded_buckets = std::size(Bounds);
  static constexpr size_t bucket_count = bounded_buckets + 1;  // the last: above every bound

  uint64_t buckets[bucket_count] = {};  // observations per bucket (not cumulative)
  uint64_t count = 0;
  uint64_t sum_usec = 0;
  uint64_t max_usec = 0;

  void observe(uint64_t usec) {
    size_t i = 0;
    while (i < bounded_buckets && usec > Bounds[i]) ++i;
    ++buckets[i];
    ++count;
    sum_usec += usec;
    if (usec > max_usec) max_usec = usec;
  }

  // Observations <= Bounds[i] (i < bounded_buckets), or all of them (i ==
  // bounded_buckets): Prometheus' `le` buckets.
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
      if (seen >= rank) return Bounds[i] < max_usec ? Bounds[i] : max_usec;
    }
    return max_usec;  // the overflow bucket
  }
};

using DiskLatencyHistogram = LatencyHistogram<disk_latency_bounds_usec>;
using RemoteLatencyHistogram = LatencyHistogram<remote_latency_bounds_usec>;

// Percentiles a status shows (what an operator reads; /metrics has the buckets).
inline constexpr uint32_t remote_latency_status_percentiles[] = {50, 99};

// One histogram's status figures, as flat keys: `<name>_timed` (observations),
// `<name>_usec_mean`, `<name>_usec_p50`, `<name>_usec_p99`, `<name>_usec_max`.
template <const auto& Bounds>
void append_latency_figures(const std::string& name, const LatencyHistogram<Bounds>& h,
                            std::vector<std::pair<std::string, uint64_t>>& ret) {
  ret.emplace_back(name + "_timed", h.count);
  ret.emplace_back(name + "_usec_mean", h.mean_usec());
  for (uint32_t p : remote_latency_status_percentiles) {
    ret.emplace_back(name + "_usec_p" + std::to_string(p), h.percentile_usec(p));
  }
  ret.emplace_back(name + "_usec_max", h.max_usec);
}

// Bounds increase, so every observation has exactly one bucket.
template <size_t N>
constexpr bool latency_bounds_increase(const uint64_t (&bounds)[N]) {
  for (size_t i = 1; i < N; ++i) {
    if (bounds[i - 1] >= bounds[i]) return false;
  }
  return true;
}
static_assert(latency_bounds_increase(disk_latency_bounds_usec));
static_assert(latency_bounds_increase(remote_latency_bounds_usec));

constexpr bool remote_latency_has_bound(uint64_t usec) {
  for (uint64_t b : remote_latency_bounds_usec) {
    if (b == usec) return true;
  }
  return false;
}

}  // namespace kvpark::daemon
