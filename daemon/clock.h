// The daemon's clocks, in microseconds since an arbitrary start (CLOCK_MONOTONIC).
#pragma once

#include <time.h>

#include <cstdint>

namespace kvpark::daemon {

inline uint64_t clock_usec(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

// Deadlines, durations, bandwidth samples.
inline uint64_t monotonic_usec() { return clock_usec(CLOCK_MONOTONIC); }
// Last-use stamps on hot paths: a few ms of resolution, no syscall cost.
inline uint64_t coarse_monotonic_usec() { return clock_usec(CLOCK_MONOTONIC_COARSE); }

}  // namespace kvpark::daemon
