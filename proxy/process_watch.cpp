#include "proxy/process_watch.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace kvpark::proxy {
namespace {

constexpr int witness_connect_msec_max = 200;  // a witness is for a nearby upstream

}  // namespace

ProcessWatch::ProcessWatch(std::string url) {
  // http://HOST:PORT[/...]; [v6] hosts in brackets.
  std::string rest = url;
  if (const size_t scheme = rest.find("://"); scheme != std::string::npos)
    rest = rest.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  size_t colon = rest.rfind(':');
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    host_ = rest.substr(1, close == std::string::npos ? std::string::npos : close - 1);
    colon = close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':'
                ? close + 1
                : std::string::npos;
  } else {
    host_ = rest.substr(0, colon);
  }
  port_ = colon == std::string::npos ? "80" : rest.substr(colon + 1);
}

ProcessWatch::~ProcessWatch() { disarm(); }

bool ProcessWatch::open(int fd) {
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // 0: closed; >0: not ours
}

int ProcessWatch::connect_witness() const {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host_.c_str(), port_.c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    int error = 0;
    socklen_t length = sizeof error;
    if (errno == EINPROGRESS && poll(&p, 1, witness_connect_msec_max) == 1 &&
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0)
      break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(found);
  return fd;
}

bool ProcessWatch::same_process() {
  std::lock_guard lock(mutex_);
  if (fd_ >= 0 && open(fd_)) return trusted_;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  trusted_ = false;
  return false;
}

bool ProcessWatch::arm() {
  const int fd = connect_witness();
  std::lock_guard lock(mutex_);
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  trusted_ = false;
  return fd_ >= 0;
}

void ProcessWatch::trust() {
  std::lock_guard lock(mutex_);
  trusted_ = fd_ >= 0;
}

bool ProcessWatch::renew() {
  {
    std::lock_guard lock(mutex_);
    if (fd_ < 0 || !open(fd_)) return false;
  }
  const int fresh = connect_witness();
  std::lock_guard lock(mutex_);
  // The old witness still open after the new one connected: no restart between.
  if (fresh < 0 || fd_ < 0 || !open(fd_)) {
    if (fresh >= 0) close(fresh);
    return false;
  }
  close(fd_);
  fd_ = fresh;
  return true;
}

void ProcessWatch::disarm() {
  std::lock_guard lock(mutex_);
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  trusted_ = false;
}

}  // namespace kvpark::proxy
