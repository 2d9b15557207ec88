// Socket round trips, SCM_RIGHTS receipt of the arena, reconnection (see channel.h).
#include "client/channel.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "proto/limits.h"

namespace kvpark::client {
namespace {

// Every arena mapping this process's clients hold. A new connection to a daemon
// whose arena is mapped here already reuses that mapping: its page tables were
// filled by earlier copies, and mapping the arena again costs a fault (or a
// populate) per 4 KiB page on the next restore, over half a second for a 268 MB
// state in some VMs. kvpark-proxy connects anew to declare a measured prefill rate;
// an engine may hold several clients.
class ProcessMappings {
 public:
  // A live mapping of the arena the fds name (same objects, incarnation and size),
  // or a new one. Takes the fds either way.
  Status map(int header_fd, int data_fd, uint64_t incarnation, uint64_t data_bytes,
             std::shared_ptr<shm::ArenaMapping>& ret_mapping) {
    std::lock_guard lock(mutex_);
    std::erase_if(mappings_, [](const auto& held) { return held.expired(); });
    for (const std::weak_ptr<shm::ArenaMapping>& held : mappings_) {
      std::shared_ptr<shm::ArenaMapping> m = held.lock();
      if (m && m->header().incarnation == incarnation && m->data_bytes() == data_bytes &&
          m->same_objects(header_fd, data_fd)) {
        close(header_fd);
        close(data_fd);
        ret_mapping = std::move(m);
        return Status::Ok;
      }
    }
    const Status s =
        shm::ArenaMapping::attach(header_fd, data_fd, data_bytes, incarnation, ret_mapping);
    if (s == Status::Ok) mappings_.push_back(ret_mapping);
    return s;
  }

 private:
  std::mutex mutex_;
  std::vector<std::weak_ptr<shm::ArenaMapping>> mappings_;
};

// Never destroyed: a client may disconnect during static destruction.
ProcessMappings& process_mappings() {
  static auto* mappings = new ProcessMappings;
  return *mappings;
}

}  // namespace

Channel::Channel(std::string socket_path, wire::HelloRequest hello, int reply_timeout_msec)
    : socket_path_(std::move(socket_path)),
      reply_timeout_msec_(reply_timeout_msec),
      hello_(std::move(hello)),
      receive_buffer_(limits::frame_bytes_max + 1) {}

Channel::~Channel() {
  std::lock_guard lock(mutex_);
  drop_locked();
}

void Channel::drop_locked() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  if (attachment_.mapping) last_mapping_ = attachment_.mapping;
  attachment_ = Attachment{};
}

bool Channel::backing_off_locked() const {
  return fd_ < 0 && silent_ &&
         std::chrono::steady_clock::now() - silent_since_ <
             std::chrono::milliseconds(silent_daemon_backoff_msec);
}

void Channel::note_silence_locked() {
  silent_ = true;
  silent_since_ = std::chrono::steady_clock::now();
}

Status Channel::connect(Attachment& ret_attachment) {
  std::lock_guard lock(mutex_);
  if (backing_off_locked()) return Status::Unavailable;
  if (fd_ < 0) {
    if (Status s = connect_locked(); s != Status::Ok) return s;
  }
  ret_attachment = attachment_;
  return Status::Ok;
}

Status Channel::connect_locked() {
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(std::min(admission_retry_msec_max,
                                                          reply_timeout_msec_));
  int backoff_msec = admission_backoff_msec_first;
  for (;;) {
    Status s = Status::Ok;
    try {
      s = connect_once_locked();
    } catch (...) {  // an allocation failed: leave no half-greeted socket behind
      drop_locked();
      throw;
    }
    if (s != Status::LimitExceeded ||
        std::chrono::steady_clock::now() + std::chrono::milliseconds(backoff_msec) > give_up)
      return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_msec));
    backoff_msec = std::min(2 * backoff_msec, admission_backoff_msec_last);
  }
}

Status Channel::connect_once_locked() {
  assert(fd_ < 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof addr.sun_path) return Status::InvalidArgument;
  std::memcpy(addr.sun_path, socket_path_.c_str(), socket_path_.size());
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IoError;
  const timeval timeout{reply_timeout_msec_ / 1000, (reply_timeout_msec_ % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    close(fd);
    // A full backlog that did not drain within the timeout: nobody is accepting.
    if (err == EAGAIN) note_silence_locked();
    return err == EACCES || err == EPERM ? Status::PermissionDenied : Status::Unavailable;
  }
  fd_ = fd;
  // Every plan open now was made on an earlier connection.
  hello_.holds_earlier_grants = open_grants_ > 0;
  std::vector<uint8_t> request;
  wire::encode(hello_, 0, request);
  Status answer = Status::Ok;
  std::vector<uint8_t> body;
  ReceivedFds arena_fds;  // header, data
  Status s = round_trip_locked(request, answer, body, &arena_fds);
  wire::HelloReply reply;
  if (s == Status::Ok && answer != Status::Ok) s = answer;
  if (s == Status::Ok &&
      (wire::decode(body, reply) != Status::Ok || arena_fds.count != 2)) {
    s = Status::ProtocolError;
  }
  std::shared_ptr<shm::ArenaMapping> mapping;
  // The arena may be mapped here already: by this channel, when the daemon that
  // answers adopted the arena of the one before (last_mapping_ keeps it until now),
  // or by another client of this process. That mapping is kept: no remap, no
  // first-touch faults on the next restores.
  if (s == Status::Ok) {
    s = process_mappings().map(arena_fds.fds[0], arena_fds.fds[1], reply.incarnation,
                               reply.data_bytes, mapping);
    arena_fds.count = 0;  // map took them
  }
  last_mapping_.reset();
  for (size_t i = 0; i < arena_fds.count; ++i) close(arena_fds.fds[i]);
  if (s != Status::Ok) {
    drop_locked();
    return s;
  }
  attachment_ = Attachment{.hello = reply, .mapping = std::move(mapping),
                           .generation = ++generations_};
  return Status::Ok;
}

Status Channel::round_trip_locked(std::vector<uint8_t>& request, Status& ret_status,
                                  std::vector<uint8_t>& ret_body, ReceivedFds* ret_fds) {
  assert(fd_ >= 0 && request.size() >= wire::frame_header_bytes);
  const uint32_t sequence = ++sequence_;
  std::memcpy(request.data() + 4, &sequence, sizeof sequence);
  const uint16_t request_verb = static_cast<uint16_t>(request[0] | (request[1] << 8));
  // If the send fails the daemon may already have refused us with a reply: read it.
  const bool sent = send(fd_, request.data(), request.size(), MSG_NOSIGNAL) ==
                    static_cast<ssize_t>(request.size());
  if (!sent && errno == EAGAIN) note_silence_locked();  // its queue stayed full
  iovec iov{receive_buffer_.data(), receive_buffer_.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * ReceivedFds::fds_max)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | (sent ? 0 : MSG_DONTWAIT));
  } while (n < 0 && errno == EINTR);
  if (n < 0 && errno == EAGAIN && sent) note_silence_locked();  // the whole reply timeout
  if (n < 0 && errno == ECONNRESET) {
    // A daemon that refuses us at accept closes with our request unread: the kernel
    // reports the reset first, and its refusal reply is still queued behind it.
    msg.msg_controllen = sizeof control;
    n = recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  }
  if (n <= 0) return Status::Unavailable;  // EOF, reset or timeout
  ReceivedFds received;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n_fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n_fds; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (received.count < ReceivedFds::fds_max) {
        received.fds[received.count++] = fd;
      } else {
        close(fd);
      }
    }
  }
  if (ret_fds != nullptr) {
    *ret_fds = received;
  } else {
    for (size_t i = 0; i < received.count; ++i) close(received.fds[i]);
  }
  wire::FrameHeader header;
  std::span<const uint8_t> body;
  if ((msg.msg_flags & MSG_TRUNC) != 0 ||
      wire::decode_header({receive_buffer_.data(), static_cast<size_t>(n)}, header, body) !=
          Status::Ok ||
      header.verb != (request_verb | wire::reply_bit)) {
    return Status::ProtocolError;
  }
  // A refusal at accept time (seq 0) answers whatever we sent first.
  const bool refusal = header.sequence == 0 && header.status != 0;
  if (header.sequence != sequence && !refusal) return Status::ProtocolError;
  ret_status = static_cast<Status>(header.status);
  ret_body.assign(body.begin(), body.end());
  return Status::Ok;
}

Status Channel::call(std::vector<uint8_t>& request, uint64_t generation, Status& ret_status,
                     std::vector<uint8_t>& ret_body, Attachment& ret_attachment, bool opens_grant) {
  std::lock_guard lock(mutex_);
  if (backing_off_locked()) return Status::Unavailable;
  silent_ = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (generation != 0 && (fd_ < 0 || attachment_.generation != generation)) {
      return Status::Unavailable;
    }
    if (fd_ < 0) {
      if (Status s = connect_locked(); s != Status::Ok) return s;
    }
    Status s = Status::Unavailable;
    try {
      s = round_trip_locked(request, ret_status, ret_body, nullptr);
    } catch (...) {  // the reply could not be kept: what it granted ends with the connection
      drop_locked();
      throw;
    }
    if (s == Status::Ok) {
      ret_attachment = attachment_;
      if (opens_grant && ret_status == Status::Ok) ++open_grants_;
      return Status::Ok;
    }
    drop_locked();
    // A silent daemon is not asked again: that would wait as long once more.
    if (s != Status::Unavailable || silent_) return s;
  }
  return Status::Unavailable;
}

void Channel::grant_closed() {
  std::lock_guard lock(mutex_);
  assert(open_grants_ > 0);
  --open_grants_;
}

void Channel::drop() {
  std::lock_guard lock(mutex_);
  drop_locked();
}

Status Channel::send_one_way(std::vector<uint8_t>& request, uint64_t generation) {
  std::lock_guard lock(mutex_);
  if (fd_ < 0 || attachment_.generation != generation) return Status::Unavailable;
  const uint32_t sequence = ++sequence_;
  std::memcpy(request.data() + 4, &sequence, sizeof sequence);
  if (send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    drop_locked();
    return Status::Unavailable;
  }
  return Status::Ok;
}

}  // namespace kvpark::client
