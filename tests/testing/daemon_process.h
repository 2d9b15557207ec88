// A real kvparkd for tests and benchmarks: its own socket directory and arena
// name, started as a child process and stopped (or killed) by its owner. The one
// launcher of the tree: the test suites, kvpark-bench, kvpark-replay and
// kvpark-proxy-bench all start their daemons here (tests/testing/meson.build).
//
// The daemon says when it is ready the way it tells systemd: each DaemonProcess
// owns a NOTIFY_SOCKET and start() returns at READY=1, whose STATUS= also names
// the bound HTTP address when the daemon listens (so --http-listen 127.0.0.1:0
// works without reading the log). Child exits are waited for on a pidfd.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/testing/fd_store.h"

namespace kvpark::testing {

struct DaemonConfig {
  uint64_t arena_bytes = 64ull << 20;
  uint64_t reservation_bytes_max = 0;  // 0: the daemon's default
  std::vector<std::string> extra_args;
  std::vector<std::string> env;  // "NAME=value" for the daemon's environment
  std::string kvparkd;           // the executable; empty: $KVPARKD (built_binary)
  // Where the socket, log and notify socket go (read at construction); empty: a
  // fresh /tmp/kvpark-<label>-XXXXXX, removed with the DaemonProcess. A directory
  // given here is kept, and so is the log in it.
  std::string directory;
  std::string label = "test";  // in the directory and arena names (/kvpark-<label>-PID-N)
  int ready_timeout_msec = 0;  // how long start() waits for READY=1; 0: daemon_ready_msec_max
  // The daemon gets SIGKILL when the thread that started it exits (PR_SET_PDEATHSIG):
  // a benchmark that crashes leaves no daemon holding a large arena.
  bool die_with_parent = false;
  // Play systemd's fd store (fd_store.h): keep what the daemon stores and pass it
  // back at the next start. Off: stored fds are closed, as with FileDescriptorStoreMax=0.
  bool fd_store = false;
};

// How long start() waits for READY=1 unless told otherwise: a large arena takes a
// while to commit on one core shared with a CPU hog.
inline constexpr int daemon_ready_msec_max = 60'000;

class DaemonProcess {
 public:
  explicit DaemonProcess(DaemonConfig config = {});
  ~DaemonProcess();  // SIGKILLs a daemon still running and removes its files

  // Starts kvparkd and waits for its READY=1 (the engine socket then accepts,
  // the D-Bus name is claimed and HTTP listens); false if it exits first.
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
  // What the next start() uses (a test may change it between runs).
  DaemonConfig& config() { return config_; }

  const std::string& socket_path() const { return socket_path_; }
  const std::string& arena_name() const { return arena_name_; }
  const std::string& log_path() const { return log_path_; }
  std::string log_tail() const;  // the log's last 2000 bytes, for a failure message
  pid_t pid() const { return pid_; }
  // The HTTP port the running daemon reported at READY=1; -1 when it serves no HTTP.
  int http_port() const { return http_port_; }
  // Waits for the next notify message holding the line `field` (e.g. "READY=1",
  // sent again when a reload finished); false if the daemon exits or time runs out.
  // The whole message goes to ret_message.
  bool wait_notify(const std::string& field, int timeout_msec, std::string* ret_message = nullptr);
  // The manager's fd store (config().fd_store); a test may read, scribble on or clear it.
  ManagerFdStore& fd_store() { return fd_store_; }

 private:
  bool wait_ready(int timeout_msec);
  // Handles queued notify messages (their fds go to the store) up to the first
  // holding the line `field` (to ret_message; true); empty field: all of them.
  bool drain_notify(const std::string& field = "", std::string* ret_message = nullptr);

  DaemonConfig config_;
  std::string directory_;
  bool owns_directory_ = false;  // made here: removed with this
  std::string notify_path_;
  int notify_fd_ = -1;
  ManagerFdStore fd_store_;
  int http_port_ = -1;
  std::string socket_path_;
  std::string arena_name_;
  std::string log_path_;
  pid_t pid_ = -1;
};

// Path of a binary built by meson, from the environment meson test sets
// (KVPARKD, KVPARK_TEST_ENGINE).
std::string built_binary(const char* env_name);

// The kvparkd a tool run by hand starts (kvpark-bench, kvpark-replay): flag_value
// (its --kvparkd), else $KVPARKD, else beside the running executable (build tree
// or install layout), else the installed sbindir, else the one this tree built.
// Empty when none exists.
std::string find_kvparkd(const std::string& flag_value);

// A TCP port on 127.0.0.1 that was free a moment ago (bound, then released).
int free_tcp_port();

// CLOCK_MONOTONIC in milliseconds.
uint64_t now_msec();

// posix_spawn of argv[0] (a path) with stdout/stderr on the given descriptors
// (-1: inherited) and this environment plus `env_overrides` ("NAME=value", which
// replace variables of the same name); -1 when it cannot be started.
// With die_with_parent the child gets SIGKILL when the calling thread exits
// (PR_SET_PDEATHSIG).
pid_t spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd,
            const std::vector<std::string>& env_overrides = {}, bool die_with_parent = false);

// A close-on-exec AF_UNIX socket of `type` (SOCK_DGRAM, SOCK_SEQPACKET; flags such
// as SOCK_NONBLOCK may be or'ed in) bound at `path`, not listening; -1 on failure.
int bind_unix_socket(const std::string& path, int type);

// The "http on HOST:PORT" port of a kvparkd READY=1 notify message; -1 if absent.
int http_port_in_ready_message(const std::string& message);

// waitpid with a deadline (a pidfd, no polling): the status, or -1 if the child
// still runs at the deadline.
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
