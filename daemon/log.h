// Logging to stderr, with journald priority prefixes (sd-daemon(3)) only when stderr
// is the journal: $JOURNAL_STREAM names the device and inode of the stream systemd
// connected (systemd.exec(5)), and they must be stderr's own. On a terminal, a pipe
// or a plain file lines carry no prefix.
//
// Only the daemon logs; libraries return a status. Hot paths use the
// *_limited variants, which let through log_burst_max lines per
// log_interval_usec and then count what they dropped.
#pragma once

#include <cstdarg>
#include <cstdint>

namespace kvpark::daemon {

inline constexpr uint64_t log_interval_usec = 10'000'000;
inline constexpr uint32_t log_burst_max = 10;

// True when stderr is the journal stream that $JOURNAL_STREAM names.
bool stderr_is_journal();

void log_at(int priority, const char* format, ...) __attribute__((format(printf, 2, 3)));
void log_limited_at(int priority, const char* format, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) ::kvpark::daemon::log_at(3, __VA_ARGS__)
#define log_warning(...) ::kvpark::daemon::log_at(4, __VA_ARGS__)
#define log_notice(...) ::kvpark::daemon::log_at(5, __VA_ARGS__)
#define log_info(...) ::kvpark::daemon::log_at(6, __VA_ARGS__)
#define log_warning_limited(...) ::kvpark::daemon::log_limited_at(4, __VA_ARGS__)

}  // namespace kvpark::daemon
