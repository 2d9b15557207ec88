// SOCK_SEQPACKET server over Park (see server.h); each request frame is handled in
// server_frames.cpp.
#include "daemon/server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "daemon/clock.h"
#include "daemon/log.h"
#include "daemon/pid_lock.h"
#include "daemon/remote_tier.h"
#include "proto/limits.h"

namespace kvpark::daemon {

ConnectionId take_connection_id(ConnectionId& next, const std::function<bool(ConnectionId)>& open) {
  for (;;) {  // at most connections_max + 2 rounds: that many ids can be taken
    const ConnectionId id = next++;
    if (id != 0 && id != remote_connection_id && !open(id)) return id;
  }
}
namespace {

constexpr uint64_t listen_token = 0;
constexpr uint64_t signal_token = UINT64_MAX;
constexpr uint64_t watch_token_base = uint64_t{1} << 40;  // above every ConnectionId
constexpr int listen_backlog = 64;
constexpr int frames_per_wakeup_max = 16;  // fairness between busy connections
constexpr int epoll_events_max = 64;

// Whether `pid` lists `gid` among its supplementary groups.
bool process_in_group(pid_t pid, gid_t gid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream groups(line.substr(7));
    unsigned long g;
    while (groups >> g) {
      if (g == gid) return true;
    }
  }
  return false;
}

// Whether something accepts connections on the socket file at `addr`.
bool socket_answers(const sockaddr_un& addr) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool answers =
      connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 || errno == EAGAIN;
  close(fd);
  return answers;
}

}  // namespace

Server::Server(const ServerOptions& options, Park& park)
    : options_(options), park_(park), receive_buffer_(limits::frame_bytes_max + 1) {
  // WAIT answers come later, when a promotion lands or the deadline passes.
  park_.set_reply_sink([this](ConnectionId id, std::vector<uint8_t>&& frame) {
    if (open(id)) send_reply(id, frame, false);
  });
}

void Server::close_connections() {
  while (!connections_.empty()) close_connection(connections_.begin()->first);
}

Server::~Server() {
  park_.set_reply_sink(nullptr);
  close_connections();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    // Only our own socket file: never one another daemon bound after us.
    struct stat st {};
    if (socket_inode_ != 0 && stat(options_.socket_path.c_str(), &st) == 0 &&
        st.st_ino == socket_inode_) {
      unlink(options_.socket_path.c_str());
    }
  }
  if (options_.lock_fd >= 0) close(options_.lock_fd);  // the lock file stays: unlinking it races a successor
  if (signal_fd_ >= 0) close(signal_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status claim_socket_path(const std::string& socket_path, SocketClaim& ret_claim,
                         int& ret_errno) {
  ret_claim = SocketClaim{};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof addr.sun_path) {
    ret_errno = ENAMETOOLONG;
    return Status::InvalidArgument;
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size());
  PidLock lock;
  if (const Status s = take_pid_lock(socket_path + ".lock", lock, ret_errno); s != Status::Ok) {
    ret_claim.other_pid = lock.other_pid;
    return s;
  }
  const int fd = lock.fd;
  // The lock is ours; a daemon that predates the lock file (or whose lock file was
  // removed) may still answer on the path. Only a file nobody answers on is stale.
  if (socket_answers(addr)) {
    close(fd);
    ret_errno = EADDRINUSE;
    return Status::AlreadyPresent;
  }
  ret_claim.lock_fd = fd;
  return Status::Ok;
}

Status Server::listen(int& ret_errno) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.empty() || options_.socket_path.size() >= sizeof addr.sun_path) {
    ret_errno = ENAMETOOLONG;
    return Status::InvalidArgument;
  }
  std::memcpy(addr.sun_path, options_.socket_path.c_str(), options_.socket_path.size());
  assert(options_.lock_fd >= 0 && "claim_socket_path() first");
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  // A socket file left by a crashed daemon would make bind fail; nobody listens on it.
  (void)unlink(options_.socket_path.c_str());
  struct stat st {};
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      stat(options_.socket_path.c_str(), &st) != 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  socket_inode_ = st.st_ino;
  if (chmod(options_.socket_path.c_str(), 0660) != 0 ||
      ::listen(listen_fd_, listen_backlog) != 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  // Members of the attach group reach the socket through its group bits: it takes that
  // group (a daemon running as root, or as a member of the group, may give it).
  const gid_t group = options_.attach_gid;
  if (group != static_cast<gid_t>(-1) && st.st_gid != group &&
      chown(options_.socket_path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    log_warning(
        "kvparkd: cannot give %s to the attach group (gid %u): %s; only its owner and "
        "root can connect",
        options_.socket_path.c_str(), unsigned(group), strerror(errno));
  }
  if (!write_pid(options_.lock_fd)) {
    log_warning("kvparkd: cannot write the pid to %s.lock: %s", options_.socket_path.c_str(),
                strerror(errno));
  }
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  signal_fd_ = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (epoll_fd_ < 0 || signal_fd_ < 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_token;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
  ev.data.u64 = signal_token;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, signal_fd_, &ev);
  return Status::Ok;
}

Status Server::run(int tick_msec, void (*on_tick)(void*), void* tick_context) {
  assert(epoll_fd_ >= 0);
  epoll_event events[epoll_events_max];
  while (!stop_requested_) {
    int n = epoll_wait(epoll_fd_, events, epoll_events_max, tick_msec);
    if (n < 0 && errno != EINTR) return Status::IoError;
    for (int i = 0; i < n; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == listen_token) {
        accept_all();
      } else if (token >= watch_token_base && token != signal_token) {
        watches_.at(token - watch_token_base)();
      } else if (token == signal_token) {
        signalfd_siginfo info{};
        while (read(signal_fd_, &info, sizeof info) == sizeof info) {
          log_info("kvparkd: stopping on %s",
                   info.ssi_signo == SIGTERM ? "SIGTERM" : info.ssi_signo == SIGINT ? "SIGINT" : "a signal");
          stop_requested_ = true;
        }
      } else {
        const auto id = static_cast<ConnectionId>(token);
        if (!open(id)) continue;  // closed earlier in this batch
        if ((events[i].events & (EPOLLHUP | EPOLLERR)) && !connections_.at(id).outbox.empty()) {
          close_connection(id);  // a peer that hung up cannot take its pending reply
          continue;
        }
        if (events[i].events & EPOLLOUT) on_writable(id);
        if (open(id) && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(id);
      }
      close_pending();
    }
    expire_handshakes();
    if (on_tick != nullptr) on_tick(tick_context);
    close_pending();
  }
  return Status::Ok;
}

bool Server::watch(int fd, std::function<void()> on_readable) {
  assert(epoll_fd_ >= 0 && "listen() first");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = watch_token_base + watches_.size();
  watches_.push_back(std::move(on_readable));
  return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) == 0;
}

bool Server::peer_allowed(const ucred& cred) const {
  if (cred.uid == 0 || cred.uid == geteuid()) return true;
  const gid_t group = options_.attach_gid;
  return group != static_cast<gid_t>(-1) &&
         (cred.gid == group || process_in_group(cred.pid, group));
}

void Server::accept_all() {
  for (;;) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        log_warning("kvparkd: accept failed: %s", strerror(errno));
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    Status refusal = Status::Ok;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || !peer_allowed(cred)) {
      refusal = Status::PermissionDenied;
    }
    const ConnectionId id =
        take_connection_id(next_id_, [this](ConnectionId c) { return connections_.contains(c); });
    if (refusal == Status::Ok &&
        (per_pid_[cred.pid] >= limits::connections_per_process_max ||
         (per_uid_[cred.uid] >= limits::connections_per_uid_max &&
          !displace_for(cred.uid, cred.pid)))) {
      refusal = Status::LimitExceeded;  // this user's share is taken; others still get in
    }
    if (refusal == Status::Ok)
      refusal = park_.open(id, static_cast<uint32_t>(cred.pid), static_cast<uint32_t>(cred.uid));
    if (refusal != Status::Ok) {
      // Tell the peer why before closing; its HELLO reads this reply.
      std::vector<uint8_t> frame;
      wire::encode(static_cast<uint16_t>(wire::Verb::Hello) | wire::reply_bit,
                   static_cast<uint16_t>(refusal), 0, frame);
      (void)send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      close(fd);
      if (per_uid_[cred.uid] == 0) per_uid_.erase(cred.uid);
      if (per_pid_[cred.pid] == 0) per_pid_.erase(cred.pid);
      log_warning_limited("kvparkd: refused pid %d uid %u: %s", cred.pid, cred.uid,
                          std::string(status_name(refusal)).c_str());
      continue;
    }
    ++per_uid_[cred.uid];
    ++per_pid_[cred.pid];
    connections_.emplace(id, Connection{.fd = fd, .pid = cred.pid, .uid = cred.uid,
                                        .accepted_usec = monotonic_usec()});
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
}

bool Server::displace_for(uid_t uid, pid_t pid) {
  const size_t newcomer = per_pid_.contains(pid) ? per_pid_.at(pid) : 0;
  // The uid's process holding the most connections, and its oldest idle one.
  pid_t largest = 0;
  size_t largest_count = 0;
  for (const auto& [id, c] : connections_) {
    if (c.uid != uid || c.pid == pid) continue;
    const size_t count = per_pid_.at(c.pid);
    if (count > largest_count) largest = c.pid, largest_count = count;
  }
  if (largest_count <= newcomer + 1) return false;  // pid would hold as many: its share
  ConnectionId oldest = 0;
  uint64_t oldest_usec = UINT64_MAX;
  for (const auto& [id, c] : connections_) {
    if (c.pid != largest || c.closing || !c.outbox.empty() || !park_.idle(id)) continue;
    if (c.accepted_usec < oldest_usec) oldest = id, oldest_usec = c.accepted_usec;
  }
  if (oldest_usec == UINT64_MAX) return false;
  log_warning_limited("kvparkd: uid %u at its %zu connections: closing the oldest idle one of "
                      "pid %d (%zu held) for pid %d",
                      uid, limits::connections_per_uid_max, largest, largest_count, pid);
  park_.count_displaced();
  close_connection(oldest);
  return true;
}

void Server::update_interest(ConnectionId id) {
  Connection& c = connections_.at(id);
  epoll_event ev{};
  ev.events = c.outbox.empty() ? EPOLLIN : EPOLLOUT;
  ev.data.u64 = id;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

void Server::on_readable(ConnectionId id) {
  for (int i = 0; i < frames_per_wakeup_max; ++i) {
    Connection& c = connections_.at(id);
    if (!c.outbox.empty()) return;
    iovec iov{receive_buffer_.data(), receive_buffer_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    // No control buffer: any fds a peer tries to pass are discarded by the kernel
    // and flagged MSG_CTRUNC, which we treat as a protocol error.
    ssize_t n = recvmsg(c.fd, &msg, MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      close_connection(id);
      return;
    }
    if (n == 0) {  // EOF: the engine exited or crashed
      close_connection(id);
      return;
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 ||
        !handle_frame(id, {receive_buffer_.data(), static_cast<size_t>(n)})) {
      park_.count_protocol_error();
      log_warning_limited("kvparkd: protocol error from pid %d, closing its connection",
                          c.pid);
      close_later(id);
      return;
    }
    if (!open(id)) return;
  }
}

void Server::on_writable(ConnectionId id) {
  Connection& c = connections_.at(id);
  std::vector<uint8_t> frame = std::move(c.outbox);
  c.outbox.clear();
  if (!send_reply(id, frame, c.send_fd_with_outbox)) return;
  if (connections_.at(id).outbox.empty()) on_readable(id);
}

bool Server::send_reply(ConnectionId id, std::vector<uint8_t>& frame, bool with_arena_fd) {
  Connection& c = connections_.at(id);
  if (c.closing) return false;
  iovec iov{frame.data(), frame.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  const int arena_fds[2] = {options_.arena_header_fd, options_.arena_data_fd};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof arena_fds)] = {};
  if (with_arena_fd) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof arena_fds);
    std::memcpy(CMSG_DATA(cmsg), arena_fds, sizeof arena_fds);
  }
  ssize_t n = sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
    if (!c.outbox.empty()) {
      // A second reply while one waits: only a peer that does not read its replies
      // (and sent past a pending WAIT) gets here. One frame of memory is its budget.
      close_later(id);
      return false;
    }
    c.outbox = std::move(frame);
    c.send_fd_with_outbox = with_arena_fd;
    c.waiting_writable = true;
    update_interest(id);
    return true;
  }
  if (n < 0) {  // EPIPE, ECONNRESET: the peer is gone
    close_later(id);
    return false;
  }
  assert(static_cast<size_t>(n) == frame.size() && "seqpacket sends whole messages");
  if (c.waiting_writable) {  // the outbox drained: listen for requests again
    c.waiting_writable = false;
    c.send_fd_with_outbox = false;
    update_interest(id);
  }
  return true;
}

void Server::close_later(ConnectionId id) {
  Connection& c = connections_.at(id);
  if (c.closing) return;
  c.closing = true;
  closing_.push_back(id);
}

void Server::close_pending() {
  // Closing tells Park, which may answer other waiters and fail more replies.
  while (!closing_.empty()) {
    const ConnectionId id = closing_.back();
    closing_.pop_back();
    close_connection(id);
  }
}

void Server::close_connection(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->second.fd, nullptr);
  close(it->second.fd);
  if (--per_uid_[it->second.uid] == 0) per_uid_.erase(it->second.uid);
  if (--per_pid_[it->second.pid] == 0) per_pid_.erase(it->second.pid);
  connections_.erase(it);
  park_.close(id);
}

void Server::expire_handshakes() {
  const uint64_t now = monotonic_usec();
  std::vector<ConnectionId> late;
  for (const auto& [id, c] : connections_) {
    if (!c.greeted && now - c.accepted_usec >= limits::hello_timeout_usec) late.push_back(id);
  }
  for (ConnectionId id : late) {
    log_warning_limited("kvparkd: pid %d sent no HELLO within %llu ms, closing its connection",
                        connections_.at(id).pid,
                        static_cast<unsigned long long>(limits::hello_timeout_usec / 1000));
    park_.count_handshake_timeout();
    close_connection(id);
  }
}

}  // namespace kvpark::daemon
