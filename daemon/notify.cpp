// The notify protocol, without blocking the loop (see notify.h).
#include "daemon/notify.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "daemon/log.h"

namespace kvpark::daemon {

int watchdog_tick_msec(uint64_t watchdog_usec, int idle_msec) {
  if (watchdog_usec == 0) return idle_msec;
  // A quarter of the interval: a ping is due every half, and a tick may come late.
  const uint64_t quarter_msec = watchdog_usec / 4 / 1000;
  return static_cast<int>(std::clamp<uint64_t>(quarter_msec, 1, static_cast<uint64_t>(idle_msec)));
}

Notifier::Notifier(uint64_t watchdog_usec) : watchdog_usec_(watchdog_usec) {
  (void)connect_socket();
}

Notifier::~Notifier() {
  if (fd_ >= 0) close(fd_);
}

bool Notifier::connect_socket() {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;  // not under a service manager
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t length = std::strlen(path);
  if ((path[0] != '/' && path[0] != '@') || length >= sizeof addr.sun_path) {
    log_warning_limited("kvparkd: NOTIFY_SOCKET=%s is not a socket path: no notifications", path);
    return false;
  }
  std::memcpy(addr.sun_path, path, length);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  // Connected, so that poll() reports room in the manager's queue.
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&addr),
                        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + length)) != 0) {
    log_warning_limited("kvparkd: cannot reach the service manager at %s: %s", path,
                        strerror(errno));
    if (fd >= 0) close(fd);
    return false;
  }
  fd_ = fd;
  return true;
}

void Notifier::send(const std::string& message, int wait_msec) {
  if (fd_ < 0 && !connect_socket()) return;
  for (bool retried = false;;) {
    if (::send(fd_, message.data(), message.size(), MSG_NOSIGNAL) >= 0) {
      if (!manager_reading_) {
        log_info("kvparkd: the service manager reads notifications again (%llu dropped)",
                 static_cast<unsigned long long>(dropped_));
        manager_reading_ = true;
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN && wait_msec > 0) {
      pollfd p{fd_, POLLOUT, 0};
      (void)poll(&p, 1, wait_msec);
      wait_msec = 0;  // once
      continue;
    }
    if (errno == EAGAIN) {
      ++dropped_;
      if (manager_reading_) {
        log_warning("kvparkd: the service manager is not reading notifications: dropping them "
                    "until it does");
        manager_reading_ = false;
      }
      return;
    }
    // The manager's socket went away (e.g. it re-executed): connect anew, once.
    const int err = errno;
    close(fd_);
    fd_ = -1;
    if (retried || !connect_socket()) {
      log_warning_limited("kvparkd: notifying the service manager failed: %s", strerror(err));
      return;
    }
    retried = true;
  }
}

void Notifier::ready(const std::string& status) {
  send("READY=1\nSTATUS=" + status, state_change_wait_msec);
}

void Notifier::status(const std::string& status) {
  send("STATUS=" + status, 0);
}

void Notifier::reloading() {
  send("RELOADING=1\nSTATUS=reloading configuration", state_change_wait_msec);
}

void Notifier::reloaded(const std::string& status) {
  send("READY=1\nSTATUS=" + status, state_change_wait_msec);
}

void Notifier::stopping(const std::string& status) {
  send("STOPPING=1\nSTATUS=" + status, state_change_wait_msec);
}

void Notifier::tick(uint64_t now_usec) {
  if (watchdog_usec_ == 0 || now_usec - last_ping_usec_ < watchdog_usec_ / 2) return;
  last_ping_usec_ = now_usec;
  ++pings_sent_;
  send("WATCHDOG=1", 0);
}

}  // namespace kvpark::daemon
