// Child-process plumbing for integration tests (see daemon_process.h).
#include "tests/testing/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>

extern char** environ;

namespace kvpark::testing {
namespace {

std::atomic<int> instance_counter{0};

bool socket_accepts(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

}  // namespace

uint64_t now_msec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

pid_t spawn(const std::vector<std::string>& argv, int stdout_fd, int stderr_fd) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (stdout_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stdout_fd, STDOUT_FILENO);
  if (stderr_fd >= 0) posix_spawn_file_actions_adddup2(&actions, stderr_fd, STDERR_FILENO);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// waitpid with a deadline; -1 if the child is still running at the deadline.
int wait_with_timeout(pid_t pid, int timeout_msec) {
  const uint64_t deadline = now_msec() + timeout_msec;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    if (now_msec() >= deadline) return -1;
    usleep(2000);
  }
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
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) kill_hard();
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
                                   "--dbus", "off", "--disk-dir", "off"};
  if (config_.reservation_bytes_max != 0) {
    argv.push_back("--reservation-max");
    argv.push_back(std::to_string(config_.reservation_bytes_max));
  }
  argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
  int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  pid_ = spawn(argv, -1, log_fd);
  close(log_fd);
  if (pid_ <= 0) return false;
  const uint64_t deadline = now_msec() + 10'000;
  while (now_msec() < deadline) {
    if (socket_accepts(socket_path_)) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return false;
    }
    usleep(5000);
  }
  return false;
}

int DaemonProcess::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int status = wait_with_timeout(pid_, 10'000);
  if (status == -1) kill_hard();
  pid_ = -1;
  return status;
}

int DaemonProcess::signal_and_wait(int signal_number, int timeout_msec) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal_number);
  int status = wait_with_timeout(pid_, timeout_msec);
  if (status == -1) kill_hard();
  pid_ = -1;
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
