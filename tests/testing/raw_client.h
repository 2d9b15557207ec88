// A raw SOCK_SEQPACKET peer of kvparkd for fault tests: sends arbitrary bytes
// (and fds), receives replies, and tells EOF from silence. Header-only.
#pragma once

#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "proto/limits.h"
#include "proto/wire.h"

namespace kvpark::testing {

class RawClient {
 public:
  RawClient() = default;
  explicit RawClient(const std::string& socket_path) { connect(socket_path); }
  ~RawClient() { close(); }
  RawClient(RawClient&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  RawClient& operator=(RawClient&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = other.fd_;
      other.fd_ = -1;
    }
    return *this;
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connect(const std::string& socket_path) {
    close();
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close();
      return false;
    }
    return true;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }
  bool connected() const { return fd_ >= 0; }

  // Sends one message, optionally passing `pass_fd` with SCM_RIGHTS.
  bool send(const std::vector<uint8_t>& message, int pass_fd = -1, bool dontwait = false) {
    iovec iov{const_cast<uint8_t*>(message.data()), message.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
    return n == static_cast<ssize_t>(message.size());
  }

  enum class Received { Message, Eof, Timeout, Error };
  // Waits up to timeout_msec for one message; closes any fds that came with it
  // (or hands the first ones over through ret_fds, which has room for `fds_max`).
  Received receive(std::vector<uint8_t>& ret_message, int timeout_msec = 5000,
                   int* ret_fds = nullptr, size_t fds_max = 1) {
    pollfd p{fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_msec);
    if (ready == 0) return Received::Timeout;
    if (ready < 0) return Received::Error;
    ret_message.resize(limits::frame_bytes_max + 1);
    iovec iov{ret_message.data(), ret_message.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    size_t handed = 0;
    if (n < 0) return errno == ECONNRESET ? Received::Eof : Received::Error;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (ret_fds != nullptr && handed < fds_max) {
          ret_fds[handed++] = fd;
        } else {
          ::close(fd);
        }
      }
    }
    if (n == 0) return Received::Eof;
    ret_message.resize(static_cast<size_t>(n));
    return Received::Message;
  }

  // Discards messages until EOF; false on timeout.
  bool wait_for_eof(int timeout_msec = 5000) {
    std::vector<uint8_t> m;
    for (;;) {
      const Received r = receive(m, timeout_msec);
      if (r == Received::Eof) return true;
      if (r != Received::Message) return false;
    }
  }

  // Sends `request` and decodes the reply's header; the body goes to ret_body.
  bool call(const std::vector<uint8_t>& request, wire::FrameHeader& ret_header,
            std::vector<uint8_t>& ret_body, int timeout_msec = 5000) {
    if (!send(request)) return false;
    std::vector<uint8_t> m;
    if (receive(m, timeout_msec) != Received::Message) return false;
    std::span<const uint8_t> body;
    if (wire::decode_header(m, ret_header, body) != Status::Ok) return false;
    ret_body.assign(body.begin(), body.end());
    return true;
  }

  // HELLO for `ns` keeping what an attached client is handed: the arena's header
  // and data fds (-1 when absent) and the reply. The daemon's status, or Unavailable.
  Status hello_with_arena(const NamespaceId& ns, const Geometry& geometry, int& ret_header_fd,
                          int& ret_data_fd, wire::HelloReply* ret_reply = nullptr) {
    wire::HelloRequest req;
    req.protocol_version = limits::protocol_version;
    req.namespace_id = ns;
    req.geometry = geometry;
    req.client_name = "raw";
    std::vector<uint8_t> frame, m;
    wire::encode(req, 1, frame);
    int fds[2] = {-1, -1};
    if (!send(frame) || receive(m, 5000, fds, 2) != Received::Message) return Status::Unavailable;
    ret_header_fd = fds[0];
    ret_data_fd = fds[1];
    wire::FrameHeader h;
    std::span<const uint8_t> body;
    if (wire::decode_header(m, h, body) != Status::Ok) return Status::ProtocolError;
    if (ret_reply != nullptr && h.status == 0 && wire::decode(body, *ret_reply) != Status::Ok) {
      return Status::ProtocolError;
    }
    return static_cast<Status>(h.status);
  }

  // HELLO for `ns`; returns the daemon's status (Unavailable if no reply came).
  Status hello(const NamespaceId& ns, const Geometry& geometry,
               uint32_t prefill_tokens_per_second = 0) {
    wire::HelloRequest req;
    req.protocol_version = limits::protocol_version;
    req.namespace_id = ns;
    req.geometry = geometry;
    req.prefill_tokens_per_second = prefill_tokens_per_second;
    req.client_name = "raw";
    std::vector<uint8_t> frame, body;
    wire::encode(req, 1, frame);
    wire::FrameHeader h;
    if (!call(frame, h, body)) return Status::Unavailable;
    return static_cast<Status>(h.status);
  }

 private:
  int fd_ = -1;
};

// Open file descriptors of a process (entries of /proc/<pid>/fd); -1 if unreadable.
inline int count_open_fds(pid_t pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd";
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

}  // namespace kvpark::testing
