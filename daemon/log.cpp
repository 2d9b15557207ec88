// stderr logging with <N> priority prefixes and a simple rate limit (see log.h).
#include "daemon/clock.h"
#include "daemon/log.h"

#include <time.h>

#include <cstdio>

namespace kvpark::daemon {
namespace {

void emit(int priority, const char* format, va_list args) {
  char line[1024];
  vsnprintf(line, sizeof line, format, args);
  fprintf(stderr, "<%d>%s\n", priority, line);
}

struct RateLimit {
  uint64_t window_start_usec = 0;
  uint32_t emitted = 0;
  uint64_t suppressed = 0;
};
RateLimit rate_limit;

}  // namespace

void log_at(int priority, const char* format, ...) {
  va_list args;
  va_start(args, format);
  emit(priority, format, args);
  va_end(args);
}

void log_limited_at(int priority, const char* format, ...) {
  const uint64_t now = monotonic_usec();
  if (now - rate_limit.window_start_usec >= log_interval_usec) {
    if (rate_limit.suppressed > 0) {
      fprintf(stderr, "<%d>kvparkd: %llu similar messages suppressed\n", priority,
              static_cast<unsigned long long>(rate_limit.suppressed));
    }
    rate_limit = RateLimit{.window_start_usec = now};
  }
  if (rate_limit.emitted >= log_burst_max) {
    ++rate_limit.suppressed;
    return;
  }
  ++rate_limit.emitted;
  va_list args;
  va_start(args, format);
  emit(priority, format, args);
  va_end(args);
}

}  // namespace kvpark::daemon
