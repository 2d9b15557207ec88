// The engine-facing socket server: SOCK_SEQPACKET, one frame per message.
//
// One epoll loop, one thread. Each connection is checked with SO_PEERCRED at
// accept; HELLO's reply carries the arena fd (SCM_RIGHTS). A frame that does not
// decode closes that connection only, and Park::close() runs its cleanup. A reply
// the peer is not reading waits in a one-frame outbox while reading from that
// peer pauses, so a stuck client costs one frame of memory, never a stall.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "daemon/park.h"

namespace kvpark::daemon {

struct ServerOptions {
  std::string socket_path;
  int arena_fd = -1;
  gid_t attach_gid = static_cast<gid_t>(-1);  // members may attach; -1: owner and root only
};

class Server {
 public:
  Server(const ServerOptions& options, Park& park);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens; errno in ret_errno on failure.
  Status listen(int& ret_errno);
  // Runs until SIGTERM or SIGINT (which the caller has blocked) arrives.
  // `on_tick` runs at least every tick_msec.
  Status run(int tick_msec, void (*on_tick)(void*), void* tick_context);
  void request_stop() { stop_requested_ = true; }
  // Closes every engine connection (their cleanup runs); used before a shutdown flush.
  void close_connections();
  // Runs `on_readable` on the loop whenever `fd` is readable (eventfds of other parts);
  // false, errno set, when epoll refused the fd.
  [[nodiscard]] bool watch(int fd, std::function<void()> on_readable);

 private:
  struct Connection {
    int fd = -1;
    pid_t pid = 0;
    uid_t uid = 0;
    std::vector<uint8_t> outbox;  // a reply waiting for the peer to read
    bool send_fd_with_outbox = false;
    bool waiting_writable = false;  // epoll interest is EPOLLOUT
  };

  void accept_all();
  bool peer_allowed(const ::ucred& cred) const;
  void on_readable(ConnectionId id);
  void on_writable(ConnectionId id);
  // Returns false when the connection must close.
  bool handle_frame(ConnectionId id, std::span<const uint8_t> message);
  bool send_reply(ConnectionId id, std::vector<uint8_t>& frame, bool with_arena_fd);
  void close_connection(ConnectionId id);
  void update_interest(ConnectionId id);

  ServerOptions options_;
  Park& park_;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  ConnectionId next_id_ = 1;
  std::unordered_map<ConnectionId, Connection> connections_;
  std::vector<std::function<void()>> watches_;  // epoll token watch_token_base + index
  std::vector<uint8_t> receive_buffer_;
  bool stop_requested_ = false;
};

}  // namespace kvpark::daemon
