// stderr logging with <N> priority prefixes for the journal and a simple rate limit
// (see log.h).
#include "daemon/clock.h"
#include "daemon/log.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace kvpark::daemon {
namespace {

// Decided once, at the first line: stderr does not change while the daemon runs.
bool journal_prefixes() {
  static const bool journal = stderr_is_journal();
  return journal;
}

// One line; "<N>" in front only for the journal, which turns it into the priority.
void print_line(int priority, const char* line) {
  if (journal_prefixes()) {
    fprintf(stderr, "<%d>%s\n", priority, line);
  } else {
    fprintf(stderr, "%s\n", line);
  }
}

void emit(int priority, const char* format, va_list args) {
  char line[1024];
  vsnprintf(line, sizeof line, format, args);
  print_line(priority, line);
}

struct RateLimit {
  uint64_t window_start_usec = 0;
  uint32_t emitted = 0;
  uint64_t suppressed = 0;
};
RateLimit rate_limit;

}  // namespace

bool stderr_is_journal() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  if (stream == nullptr) return false;
  unsigned long long device = 0;
  unsigned long long inode = 0;
  char end = 0;
  if (std::sscanf(stream, "%llu:%llu%c", &device, &inode, &end) != 2) return false;
  struct stat st {};
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return st.st_dev == device && st.st_ino == inode;
}

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
      char line[128];
      snprintf(line, sizeof line, "kvparkd: %llu similar messages suppressed",
               static_cast<unsigned long long>(rate_limit.suppressed));
      print_line(priority, line);
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
