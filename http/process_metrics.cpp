// process_* metrics from /proc/self (see process_metrics.h).
#include "http/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvpark::http {
namespace {

double clock_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Descriptors in /proc/self/fd, less the one that lists them.
uint64_t count_open_fds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  uint64_t count = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count > 0 ? count - 1 : 0;
}

void family(std::string& out, const char* name, const char* type, const char* help,
            const std::string& value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
         name + " " + value + "\n";
}

std::string number(double value) {
  char text[64];
  snprintf(text, sizeof text, "%.3f", value);
  return text;
}

}  // namespace

bool read_process_stats(ProcessStats& ret_stats) {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "pid (comm) state ..." where comm may hold spaces and parentheses: fields
  // start after the last ')'. Field 3 (state) is the first after it.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  unsigned long long utime = 0, stime = 0, starttime = 0, vsize = 0;
  long long rss_pages = 0;
  for (int number = 3; fields >> field; ++number) {
    switch (number) {
      case 14: utime = std::strtoull(field.c_str(), nullptr, 10); break;
      case 15: stime = std::strtoull(field.c_str(), nullptr, 10); break;
      case 22: starttime = std::strtoull(field.c_str(), nullptr, 10); break;
      case 23: vsize = std::strtoull(field.c_str(), nullptr, 10); break;
      case 24: rss_pages = std::strtoll(field.c_str(), nullptr, 10); break;
      default: break;
    }
    if (number == 24) break;
  }
  if (fields.fail()) return false;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  ProcessStats s;
  s.cpu_seconds = static_cast<double>(utime + stime) / ticks;
  s.virtual_bytes = vsize;
  s.resident_bytes = rss_pages > 0 ? uint64_t(rss_pages) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
  s.start_time_seconds = clock_seconds(CLOCK_REALTIME) - clock_seconds(CLOCK_BOOTTIME) +
                         static_cast<double>(starttime) / ticks;
  s.open_fds = count_open_fds();
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) s.max_fds = files.rlim_cur;
  ret_stats = s;
  return true;
}

std::string process_metrics_text() {
  ProcessStats s;
  if (!read_process_stats(s)) return "";
  std::string out;
  family(out, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.",
         number(s.cpu_seconds));
  family(out, "process_open_fds", "gauge", "Number of open file descriptors.",
         std::to_string(s.open_fds));
  family(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
         std::to_string(s.max_fds));
  family(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.",
         std::to_string(s.virtual_bytes));
  family(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
         std::to_string(s.resident_bytes));
  family(out, "process_start_time_seconds", "gauge",
         "Start time of the process since unix epoch in seconds.", number(s.start_time_seconds));
  return out;
}

}  // namespace kvpark::http
