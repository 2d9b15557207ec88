// A kvparkd owned by the bench: its own socket directory and arena name, killed
// with the bench (PR_SET_PDEATHSIG) if the bench dies first.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::bench {

struct DaemonSpec {
  std::string kvparkd;  // executable path
  uint64_t arena_bytes = 0;
  uint64_t reservation_bytes_max = 0;  // 0: the daemon's default
  std::string huge_pages;              // --huge-pages value; empty: the daemon's default
};

class BenchDaemon {
 public:
  BenchDaemon() = default;
  ~BenchDaemon();  // stops a running daemon and removes its files
  BenchDaemon(const BenchDaemon&) = delete;
  BenchDaemon& operator=(const BenchDaemon&) = delete;

  // Starts kvparkd and waits until its socket accepts; on failure ret_error has the log tail.
  bool start(const DaemonSpec& spec, std::string& ret_error);
  // SIGTERM and reap; false if it did not exit cleanly within the grace period.
  bool stop();

  pid_t pid() const { return pid_; }
  const std::string& socket_path() const { return socket_path_; }

 private:
  void cleanup();
  std::string directory_;
  std::string socket_path_;
  std::string arena_name_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// The kvparkd to run: --kvparkd, else $KVPARKD, else beside this executable (build
// tree or install layout), else the path meson compiled in. Empty when none exists.
std::string find_kvparkd(const std::string& flag_value);

// Starts a kvparkd command line with its output in log_path (appended or truncated),
// killed if this process dies, and waits until socket_path accepts connections.
bool spawn_daemon(std::vector<std::string> argv, const std::string& log_path, bool append,
                  const std::string& socket_path, uint64_t timeout_nsec, pid_t& ret_pid,
                  std::string& ret_error);
bool socket_accepts(const std::string& path);
std::string log_tail(const std::string& path);  // the last 2000 bytes

// "RssAnon:" of /proc/<pid>/status in KiB (private anonymous memory; the arena is
// shared memory and counts as RssShmem instead); 0 when unreadable.
uint64_t read_rss_anon_kib(pid_t pid);

}  // namespace kvpark::bench
