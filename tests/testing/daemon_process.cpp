// Child-process plumbing for integration tests and benchmarks (see daemon_process.h).
#include "tests/testing/daemon_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/prctl.h>
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
#include <fstream>
#include <sstream>
#include <string_view>

#include "tests/testing/wait.h"

extern char** environ;

namespace kvpark::testing {
namespace {

constexpr int daemon_stop_msec_max = 30'000;
constexpr size_t log_tail_bytes = 2000;

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

bool is_executable(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

}  // namespace

int bind_unix_socket(const std::string& path, int type) {
  const int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

namespace {

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
            const std::vector<std::string>& env_overrides, bool die_with_parent) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<std::string> environment = environment_with(env_overrides);
  std::vector<char*> env;
  for (std::string& e : environment) env.push_back(e.data());
  env.push_back(nullptr);
  if (die_with_parent) {  // posix_spawn cannot set a death signal: fork and exec
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before the prctl
      if (stdout_fd >= 0) dup2(stdout_fd, STDOUT_FILENO);
      if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
      execve(args[0], args.data(), env.data());
      _exit(127);
    }
    return pid;
  }
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

std::string find_kvparkd(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (std::string env = built_binary("KVPARKD"); !env.empty()) return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> candidates;
  if (!ec) {
    const std::filesystem::path dir = self.parent_path();
    candidates = {dir / "kvparkd", dir / ".." / "daemon" / "kvparkd", dir / ".." / "sbin" / "kvparkd"};
  }
#ifdef KVPARK_TESTING_SBINDIR
  candidates.emplace_back(std::filesystem::path(KVPARK_TESTING_SBINDIR) / "kvparkd");
#endif
#ifdef KVPARK_TESTING_KVPARKD
  candidates.emplace_back(KVPARK_TESTING_KVPARKD);
#endif
  for (const auto& c : candidates) {
    if (is_executable(c)) return std::filesystem::weakly_canonical(c, ec).string();
  }
  return "";
}

DaemonProcess::DaemonProcess(DaemonConfig config) : config_(std::move(config)) {
  const int n = instance_counter++;
  if (config_.directory.empty()) {
    std::string templ = "/tmp/kvpark-" + config_.label + "-XXXXXX";
    if (mkdtemp(templ.data()) != nullptr) directory_ = templ;  // else start() refuses
    owns_directory_ = true;
  } else {
    directory_ = config_.directory;
    std::error_code ec;
    std::filesystem::create_directories(directory_, ec);
  }
  socket_path_ = directory_ + "/kvparkd.sock";
  arena_name_ = "/kvpark-" + config_.label + "-" + std::to_string(getpid()) + "-" + std::to_string(n);
  log_path_ = directory_ + "/kvparkd.log";
  notify_path_ = directory_ + "/notify";
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) kill_hard();
  if (notify_fd_ >= 0) close(notify_fd_);
  std::error_code ec;
  if (directory_.empty()) {
    // mkdtemp failed: nothing was made
  } else if (owns_directory_) {
    std::filesystem::remove_all(directory_, ec);
  } else {
    std::filesystem::remove(notify_path_, ec);  // the log stays with its directory
    std::filesystem::remove(socket_path_, ec);
  }
  shm_unlink(arena_name_.c_str());
}

std::string DaemonProcess::log_tail() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  return s.size() > log_tail_bytes ? s.substr(s.size() - log_tail_bytes) : s;
}

bool DaemonProcess::start() {
  if (directory_.empty()) return false;  // no directory of its own could be made
  // Tests run many daemons side by side: no shared HTTP port, bus name or state
  // directory unless a test asks for one (extra_args come later and win).
  const std::string kvparkd = config_.kvparkd.empty() ? built_binary("KVPARKD") : config_.kvparkd;
  std::vector<std::string> argv = {kvparkd, "--socket", socket_path_,
                                   "--arena-name", arena_name_, "--arena-size",
                                   std::to_string(config_.arena_bytes), "--http-listen", "off",
                                   "--dbus", "off", "--disk-dir", "off",
                                   "--state-dir", "off"};
  if (config_.reservation_bytes_max != 0) {
    argv.push_back("--reservation-max");
    argv.push_back(std::to_string(config_.reservation_bytes_max));
  }
  argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
  if (notify_fd_ < 0) notify_fd_ = bind_unix_socket(notify_path_, SOCK_DGRAM | SOCK_NONBLOCK);  // sd_notify
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
    // stdout too: a benchmark's own stdout (--json) stays its own.
    pid_ = spawn(argv, log_fd, log_fd, env, config_.die_with_parent);
  }
  close(log_fd);
  if (pid_ <= 0) return false;
  return wait_ready(config_.ready_timeout_msec > 0 ? config_.ready_timeout_msec
                                                   : daemon_ready_msec_max);
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
