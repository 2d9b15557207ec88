// Lock files that name their holder (see pid_lock.h).
#include "daemon/pid_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace kvpark::daemon {
namespace {

pid_t read_pid(int fd) {
  char text[32] = {};
  const ssize_t n = pread(fd, text, sizeof text - 1, 0);
  return n > 0 ? static_cast<pid_t>(atol(text)) : 0;
}

}  // namespace

Status take_pid_lock(const std::string& path, PidLock& ret_lock, int& ret_errno) {
  ret_lock = PidLock{};
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  // Another user's file: a lock on a read-only descriptor excludes just as well.
  if (fd < 0 && errno == EACCES) fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ret_errno = errno;
    ret_lock.other_pid = read_pid(fd);
    close(fd);
    return ret_errno == EWOULDBLOCK ? Status::AlreadyPresent : Status::IoError;
  }
  ret_lock.fd = fd;
  return Status::Ok;
}

bool write_pid(int lock_fd) {
  const std::string text = std::to_string(getpid()) + "\n";
  return ftruncate(lock_fd, 0) == 0 &&
         pwrite(lock_fd, text.data(), text.size(), 0) == static_cast<ssize_t>(text.size());
}

}  // namespace kvpark::daemon
