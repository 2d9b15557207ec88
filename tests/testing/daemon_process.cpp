// Child-process plumbing for integration tests (see daemon_process.h).
#include "tests/testing/daemon_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "tests/testing/wait.h"

extern char** environ;

namespace kvpark::testing {
namespace {

// A kvparkd has this long to be ready: a large arena takes a while to commit on
// one core shared with a CPU hog.
constexpr int daemon_ready_msec_max = 60'000;
constexpr int daemon_stop_msec_max = 30'000;

std::atomic<int> instance_counter{0};

// A descriptor that polls readable once `pid` has exited; -1 where pidfds are missing.
int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

// A datagram socket bound at `path` for the notify protocol; -1 on failure.
int bind_notify_socket(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// This process's environment with `overrides` ("NAME=value") replacing or adding.
std::vector<std::string> environment_with(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view variable(*e);
    const std::string_view name = variable.substr(0, variable.find('='));
    bool replaced = false;
    for (const std::string& o : overrides)
      replaced |= o.compare(0, name.size() + 1, std::string(name) + "=") == 0;
    if (!replaced) env.emplace_back(variable);
  }
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

}  // namespace

int http_port_in_ready_message(const std::string& message) {
  const std::string marker = "http on ";  // "STATUS=serving on SOCKET, http on HOST:PORT"
  const size_t at = message.find(marker);
  if (at == std::string::npos) return -1;
  const size_t end = message.find('\n', at);
  const std::string address =
      message.substr(at + marker.size(), end == std::string::npos ? end : end - at - marker.size());
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? -1 : std::atoi(address.c_str() + colon + 1);
}

int free_tcp_port() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

uint64_t now_msec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

pid_t spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd,
            const std::vector<std::string>& env_overrides) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> environment = environment_with(env_overrides);
  std::vector<char*> env;
  for (std::string& e : environment) env.push_back(e.data());
  env.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO);
  if (stderr_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stderr_fd, STDERR_FILENO);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), env.data()) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// waitpid with a deadline; -1 if the child is still running at the deadline.
int wait_with_timeout(pid_t pid, int timeout_msec) {
  int status = 0;
  const pid_t reaped = waitpid(pid, &status, WNOHANG);
  if (reaped == pid) return status;
  if (reaped < 0) return -1;
  if (const int pidfd = open_pidfd(pid); pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    const Deadline deadline(timeout_msec);
    int ready = 0;
    while ((ready = poll(&p, 1, deadline.left_msec())) < 0 && errno == EINTR) {
    }
    close(pidfd);
    if (ready <= 0) return -1;
    return waitpid(pid, &status, 0) == pid ? status : -1;
  }
  // No pidfd (an old kernel): ask again until the deadline.
  pid_t r = 0;
  wait_until([&] { return (r = waitpid(pid, &status, WNOHANG)) != 0; }, timeout_msec);
  return r == pid ? status : -1;
}

std::string built_binary(const char* env_name) {
  const char* value = std::getenv(env_name);
  return value != nullptr ? value : "";
}

DaemonProcess::DaemonProcess(DaemonConfig config) : config_(std::move(config)) {
  const int n = instance_counter++;
  char templ[] = "/tmp/kvpark-test-XXXXXX";
  directory_ = mkdtemp(templ);
  socket_path_ = directory_ + "/kvparkd.sock";
  arena_name_ = "/kvpark-test-" + std::to_string(getpid()) + "-" + std::to_string(n);
  log_path_ = directory_ + "/kvparkd.log";
  notify_path_ = directory_ + "/notify";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) kill_hard();
  if (notify_fd_ >= 0) close(notify_fd_);
  std::error_code ec;
  std::filesystem::remove_all(directory_, ec);
  shm_unlink(arena_name_.c_str());
}

bool DaemonProcess::start() {
  // Tests run many daemons side by side: no shared HTTP port, bus name or state
  // directory unless a test asks for one (extra_args come later and win).
  std::vector<std::string> argv = {built_binary("KVPARKD"), "--socket", socket_path_,
                                   "--arena-name", arena_name_, "--arena-size",
                                   std::to_string(config_.arena_bytes), "--http-listen", "off",
                                   "--dbus", "off", "--disk-dir", "off",
                                   "--state-dir", "off"};
  if (config_.reservation_bytes_max != 0) {
    argv.push_back("--reservation-max");
    argv.push_back(std::to_string(config_.reservation_bytes_max));
  }
  argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
  if (notify_fd_ < 0) notify_fd_ = bind_notify_socket(notify_path_);
  if (notify_fd_ < 0) return false;
  drain_notify();  // what an earlier run sent: its stored fds are kept
  http_port_ = -1;
  int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  std::vector<std::string> env = config_.env;
  env.push_back("NOTIFY_SOCKET=" + notify_path_);
  if (config_.fd_store) {
    for (const char* name : {"LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"}) unsetenv(name);
    pid_ = spawn_with_fds(argv, environment_with(env), log_fd, fd_store_);
  } else {
    pid_ = spawn(argv, -1, log_fd, env);
  }
  close(log_fd);
  if (pid_ <= 0) return false;
  return wait_ready(daemon_ready_msec_max);
}

bool DaemonProcess::wait_ready(int timeout_msec) {
  std::string message;
  if (!wait_notify("READY=1", timeout_msec, &message)) return false;
  http_port_ = http_port_in_ready_message(message);
  return true;
}

bool DaemonProcess::wait_notify(const std::string& field, int timeout_msec,
                                std::string* ret_message) {
  if (pid_ <= 0 || notify_fd_ < 0) return false;
  const int pidfd = open_pidfd(pid_);
  const Deadline deadline(timeout_msec);
  bool seen = false;
  bool exited = false;
  while (!seen && !exited && !deadline.passed()) {
    pollfd p[2] = {{notify_fd_, POLLIN, 0}, {pidfd, POLLIN, 0}};
    // Without a pidfd, wake now and then to ask waitpid.
    const int wait_msec = pidfd >= 0 ? deadline.left_msec() : std::min(deadline.left_msec(), 50);
    if (poll(p, pidfd >= 0 ? 2 : 1, wait_msec) < 0 && errno != EINTR) break;
    seen = drain_notify(field, ret_message);
    int status = 0;
    if (!seen && waitpid(pid_, &status, WNOHANG) == pid_) exited = true;
  }
  if (pidfd >= 0) close(pidfd);
  if (exited) pid_ = -1;
  return seen;
}

bool DaemonProcess::drain_notify(const std::string& field, std::string* ret_message) {
  if (notify_fd_ < 0) return false;
  std::string message;
  std::vector<int> fds;
  while (receive_notify(notify_fd_, message, fds)) {
    if (config_.fd_store) {
      fd_store_.handle(message, fds);
    } else {
      for (int fd : fds) close(fd);
    }
    if (field.empty()) continue;
    if (("\n" + message + "\n").find("\n" + field + "\n") == std::string::npos) continue;
    if (ret_message != nullptr) *ret_message = message;
    return true;  // later messages wait for the next call
  }
  return false;
}

int DaemonProcess::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = wait_with_timeout(pid_, daemon_stop_msec_max);
  if (status == -1) kill_hard();
  pid_ = -1;
  drain_notify();
  return status;
}

int DaemonProcess::signal_and_wait(int signal_number, int timeout_msec) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal_number);
  int status = wait_with_timeout(pid_, timeout_msec);
  if (status == -1) kill_hard();
  pid_ = -1;
  drain_notify();
  return status;
}

bool DaemonProcess::restart() {
  if (pid_ > 0) stop();
  return start();
}

void DaemonProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  drain_notify();
}

int run_process(const std::vector<std::string>& argv, int timeout_msec, std::string* ret_output) {
  ChildProcess child = spawn_process(argv);
  if (child.pid <= 0) return -1;
  std::string output;
  const uint64_t deadline = now_msec() + timeout_msec;
  char buffer[4096];
  for (;;) {
    const int64_t left = int64_t(deadline) - int64_t(now_msec());
    if (left <= 0) break;
    pollfd p{child.stdout_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left)) <= 0) break;
    ssize_t n = read(child.stdout_fd, buffer, sizeof buffer);
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  if (ret_output != nullptr) *ret_output = output;
  const int64_t left = std::max<int64_t>(1, int64_t(deadline) - int64_t(now_msec()));
  return child.wait_exit(static_cast<int>(left));
}

ChildProcess spawn_process(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  ChildProcess child;
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return child;
  child.pid = spawn(argv, pipe_fds[1], -1);
  close(pipe_fds[1]);
  child.stdout_fd = pipe_fds[0];
  return child;
}

bool ChildProcess::wait_for_line(const std::string& line, int timeout_msec) {
  const uint64_t deadline = now_msec() + timeout_msec;
  std::string pending;
  char c;
  while (now_msec() < deadline) {
    pollfd p{stdout_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(deadline - now_msec())) <= 0) return false;
    if (read(stdout_fd, &c, 1) != 1) return false;
    if (c != '\n') {
      pending.push_back(c);
      continue;
    }
    if (pending == line) return true;
    pending.clear();
  }
  return false;
}

int ChildProcess::wait_exit(int timeout_msec) {
  if (pid <= 0) return -1;
  int status = wait_with_timeout(pid, timeout_msec);
  if (status == -1) {
    kill_hard();
    return -1;
  }
  pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void ChildProcess::kill_hard() {
  if (pid <= 0) return;
  ::kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  pid = -1;
}

ChildProcess::~ChildProcess() {
  kill_hard();
  if (stdout_fd >= 0) close(stdout_fd);
}

}  // namespace kvpark::testing
