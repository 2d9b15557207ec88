// The manager's side of the fd store (see fd_store.h).
#include "tests/testing/fd_store.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

namespace kvpark::testing {
namespace {

constexpr size_t notify_fds_max = 16;  // per datagram
constexpr size_t notify_message_bytes = 4096;
constexpr int listen_fds_start = 3;  // SD_LISTEN_FDS_START
constexpr int spawn_fd_base = 100;   // staging fds above anything passed

// The value of line `key=` in a notify message; empty when absent.
std::string field(const std::string& message, const std::string& key) {
  std::istringstream lines(message);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(key + "=", 0) == 0) return line.substr(key.size() + 1);
  }
  return "";
}

bool same_file(int a, int b) {
  struct stat sa {
  }, sb{};
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Writes `value` in decimal into `out` (no allocation: runs between fork and exec).
void format_decimal(char* out, long value) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  for (int i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  out[n] = '\0';
}

}  // namespace

void ManagerFdStore::handle(const std::string& message, const std::vector<int>& fds) {
  const std::string name = field(message, "FDNAME");
  if (field(message, "FDSTOREREMOVE") == "1") {
    for (auto it = fds_.begin(); it != fds_.end();) {
      if (it->name != name) {
        ++it;
        continue;
      }
      close(it->fd);
      ++removed_;
      it = fds_.erase(it);
    }
  }
  const bool store = field(message, "FDSTORE") == "1";
  for (int fd : fds) {
    const bool duplicate = std::any_of(fds_.begin(), fds_.end(),
                                       [&](const StoredFd& s) { return same_file(s.fd, fd); });
    if (!store || duplicate) {
      close(fd);
      continue;
    }
    fds_.push_back({.name = name.empty() ? "stored" : name, .fd = fd});
    ++stored_;
  }
}

void ManagerFdStore::clear() {
  for (const StoredFd& s : fds_) close(s.fd);
  fds_.clear();
}

int ManagerFdStore::fd(const std::string& name) const {
  for (const StoredFd& s : fds_) {
    if (s.name == name) return s.fd;
  }
  return -1;
}

size_t ManagerFdStore::count(const std::string& name) const {
  return static_cast<size_t>(
      std::count_if(fds_.begin(), fds_.end(), [&](const StoredFd& s) { return s.name == name; }));
}

bool receive_notify(int notify_fd, std::string& ret_message, std::vector<int>& ret_fds) {
  char buffer[notify_message_bytes];
  iovec iov{buffer, sizeof buffer};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * notify_fds_max)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(notify_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (n < 0) return false;
  ret_message.assign(buffer, static_cast<size_t>(n));
  ret_fds.clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      ret_fds.push_back(fd);
    }
  }
  return true;
}

pid_t spawn_with_fds(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     int stderr_fd, const ManagerFdStore& store) {
  const size_t n = store.fds().size();
  // Staged above 3+n so that placing them at 3, 4, ... never overwrites one not yet placed.
  std::vector<int> staged;
  for (const StoredFd& s : store.fds()) {
    staged.push_back(fcntl(s.fd, F_DUPFD_CLOEXEC, std::max<int>(spawn_fd_base, 3 + int(n))));
  }
  auto close_staged = [&] {
    for (int fd : staged) {
      if (fd >= 0) close(fd);
    }
  };
  if (std::find(staged.begin(), staged.end(), -1) != staged.end()) {
    close_staged();
    return -1;
  }
  std::vector<std::string> environment = env;
  std::string names;
  for (const StoredFd& s : store.fds()) names += (names.empty() ? "" : ":") + s.name;
  if (n > 0) {
    environment.push_back("LISTEN_FDS=" + std::to_string(n));
    environment.push_back("LISTEN_FDNAMES=" + names);
    environment.push_back("LISTEN_PID=" + std::string(24, '\0'));  // filled in the child
  }
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (std::string& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  char* listen_pid = n > 0 ? environment.back().data() + std::strlen("LISTEN_PID=") : nullptr;
  const pid_t pid = fork();
  if (pid == 0) {
    // Async-signal-safe calls only from here to exec.
    if (stderr_fd >= 0) dup2(stderr_fd, STDERR_FILENO);
    for (size_t i = 0; i < n; ++i) dup2(staged[i], listen_fds_start + static_cast<int>(i));
    if (listen_pid != nullptr) format_decimal(listen_pid, static_cast<long>(getpid()));
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  close_staged();
  return pid;
}

}  // namespace kvpark::testing
