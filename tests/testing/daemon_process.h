// A real kvparkd for tests: its own socket directory and arena name, started as
// a child process and stopped (or killed) by the test.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::testing {

struct DaemonConfig {
  uint64_t arena_bytes = 64ull << 20;
  uint64_t reservation_bytes_max = 0;  // 0: the daemon's default
  std::vector<std::string> extra_args;
};

class DaemonProcess {
 public:
  explicit DaemonProcess(DaemonConfig config = {});
  ~DaemonProcess();  // SIGKILLs a daemon still running and removes its files

  // Starts kvparkd and waits until its socket accepts connections.
  bool start();
  // SIGTERM and wait; returns the exit status (as from waitpid), -1 on timeout.
  int stop();
  void kill_hard();  // SIGKILL and reap
  // Sends `signal_number` and waits; the exit status (as from waitpid), -1 on
  // timeout (the daemon is then killed).
  int signal_and_wait(int signal_number, int timeout_msec = 10'000);
  // stop(), then start() again on the same socket path and arena name.
  bool restart();
  bool running() const { return pid_ > 0; }

  const std::string& socket_path() const { return socket_path_; }
  const std::string& arena_name() const { return arena_name_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

 private:
  DaemonConfig config_;
  std::string directory_;
  std::string socket_path_;
  std::string arena_name_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// Path of a binary built by meson, from the environment meson test sets
// (KVPARKD, KVPARK_TEST_ENGINE).
std::string built_binary(const char* env_name);

// CLOCK_MONOTONIC in milliseconds.
uint64_t now_msec();

// posix_spawn of argv[0] (a path) with stdout/stderr on the given descriptors
// (-1: inherited); -1 when it cannot be started.
pid_t spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd);

// waitpid with a deadline: the status, or -1 if the child still runs at the deadline.
int wait_with_timeout(pid_t pid, int timeout_msec);

// Runs a child to completion; returns its exit code, or -1 if it did not exit
// within timeout_msec (it is then killed). stdout goes to ret_output.
int run_process(const std::vector<std::string>& argv, int timeout_msec, std::string* ret_output);

// Starts a child with stdout on a pipe; the caller waits for lines from it.
struct ChildProcess {
  pid_t pid = -1;
  int stdout_fd = -1;
  ChildProcess() = default;
  ChildProcess(ChildProcess&& other) noexcept : pid(other.pid), stdout_fd(other.stdout_fd) {
    other.pid = -1;
    other.stdout_fd = -1;
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Reads until a line equal to `line` arrives or timeout; false otherwise.
  bool wait_for_line(const std::string& line, int timeout_msec);
  int wait_exit(int timeout_msec);  // exit code, or -1 (then killed)
  void kill_hard();
  ~ChildProcess();
};
ChildProcess spawn_process(const std::vector<std::string>& argv);

}  // namespace kvpark::testing
