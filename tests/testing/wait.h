// Waiting for a condition with a deadline, never for a fixed time.
//
// A test that needs something to have happened (a file unlinked, a counter
// reached, a thread parked in a wait) names the condition and waits for it; the
// deadline only bounds how long a broken build takes to fail, so it is generous
// and no figure of it is ever asserted. The condition is checked at once, then
// with a short backoff, and once more at the deadline.
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <functional>

namespace kvpark::testing {

// How long a test waits for a condition that should hold at once on an idle
// machine: long enough for one core shared with a CPU hog.
inline constexpr int wait_timeout_msec_default = 30'000;
inline constexpr int64_t wait_backoff_usec_min = 200;
inline constexpr int64_t wait_backoff_usec_max = 20'000;

// CLOCK_MONOTONIC in milliseconds.
inline uint64_t monotonic_msec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

// A point in time `timeout_msec` from now.
class Deadline {
 public:
  explicit Deadline(int timeout_msec)
      : at_msec_(monotonic_msec() + uint64_t(std::max(0, timeout_msec))) {}
  bool passed() const { return monotonic_msec() >= at_msec_; }
  // Milliseconds left, 0 once passed (a poll(2) timeout).
  int left_msec() const {
    const uint64_t now = monotonic_msec();
    return now >= at_msec_ ? 0 : static_cast<int>(at_msec_ - now);
  }

 private:
  uint64_t at_msec_;
};

// Calls `holds` until it returns true or `timeout_msec` passes; whether it held.
inline bool wait_until(const std::function<bool()>& holds,
                       int timeout_msec = wait_timeout_msec_default) {
  const Deadline deadline(timeout_msec);
  int64_t backoff_usec = wait_backoff_usec_min;
  for (;;) {
    if (holds()) return true;
    if (deadline.passed()) return false;
    const int64_t left_usec = int64_t(deadline.left_msec()) * 1000;
    const int64_t pause_usec = std::max<int64_t>(1, std::min(backoff_usec, left_usec));
    timespec ts{static_cast<time_t>(pause_usec / 1'000'000),
                static_cast<long>(pause_usec % 1'000'000) * 1000};
    nanosleep(&ts, nullptr);
    backoff_usec = std::min(backoff_usec * 2, wait_backoff_usec_max);
  }
}

}  // namespace kvpark::testing
