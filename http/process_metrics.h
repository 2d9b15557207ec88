// The standard process_* metrics of the Prometheus client libraries, for any
// /metrics page (kvparkd's and kvpark-proxy's), read from /proc/self at each scrape.
//
// Names, types and units are those of client_golang's process collector:
// process_cpu_seconds_total (user + system), process_open_fds, process_max_fds
// (RLIMIT_NOFILE, soft), process_virtual_memory_bytes, process_resident_memory_bytes,
// process_start_time_seconds (Unix time). The start time needs no /proc/stat (units
// with ProcSubset=pid cannot read it): the wall clock minus the time since boot
// (CLOCK_BOOTTIME) plus /proc/self/stat's start time since boot.
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::http {

struct ProcessStats {
  double cpu_seconds = 0;         // user + system time of every thread
  uint64_t open_fds = 0;
  uint64_t max_fds = 0;           // soft RLIMIT_NOFILE
  uint64_t virtual_bytes = 0;
  uint64_t resident_bytes = 0;
  double start_time_seconds = 0;  // since the Unix epoch
};

// Reads this process's figures; false when /proc/self/stat cannot be read.
bool read_process_stats(ProcessStats& ret_stats);

// The six families in the text exposition format 0.0.4 (HELP, TYPE, one sample each);
// empty when /proc/self/stat cannot be read.
std::string process_metrics_text();

}  // namespace kvpark::http
