// The engine-facing socket server: SOCK_SEQPACKET, one frame per message.
//
// One epoll loop, one thread. Each connection is checked with SO_PEERCRED at
// accept; HELLO's reply carries the arena's two fds, header then data (SCM_RIGHTS). A frame that does not
// decode closes that connection only, and Park::close() runs its cleanup. A reply
// the peer is not reading waits in a one-frame outbox while reading from that
// peer pauses, so a stuck client costs one frame of memory, never a stall.
//
// One daemon per socket path: listen() takes an flock on "<socket>.lock" (which
// holds the owner's pid) and probes the path with a connect; a live daemon on
// either means AlreadyPresent, and the socket file is left alone. The daemon only
// ever unlinks the socket file it bound itself (same inode).
//
// Admission: a peer past limits::connections_per_process_max is refused at accept. A
// uid at limits::connections_per_uid_max shares it fairly among its processes: a
// process holding fewer connections than another of the same uid is admitted in
// place of that other's oldest idle connection (no reply pending, nothing leased or
// reserved), so a process churning or leaking connections cannot lock a sibling
// engine out; only when there is none to displace is the peer refused. One that has
// not completed HELLO within limits::hello_timeout_usec is closed (Park counts it).
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

// The right to serve one socket path: an flock on "<socket>.lock", held until exit.
struct SocketClaim {
  int lock_fd = -1;
  pid_t other_pid = 0;  // AlreadyPresent: the daemon holding it (0: unknown)
};
// Takes the lock beside `socket_path` and checks nobody answers on the path. Call it
// before touching anything another daemon may own (arena name, disk directory).
// AlreadyPresent when a live daemon holds either; IoError with errno otherwise.
Status claim_socket_path(const std::string& socket_path, SocketClaim& ret_claim, int& ret_errno);

// The next connection id from `next` on (which it advances): ids are 32 bits, and a
// daemon that runs for months under a client that reconnects often wraps them. Skips
// 0, the remote tier's pseudo-connection and every id `open` says is still in use.
ConnectionId take_connection_id(ConnectionId& next, const std::function<bool(ConnectionId)>& open);

struct ServerOptions {
  std::string socket_path;
  int lock_fd = -1;  // from claim_socket_path(); the server owns it from here
  int arena_header_fd = -1;  // sealed against writes
  int arena_data_fd = -1;    // sealed against shrink and grow
  gid_t attach_gid = static_cast<gid_t>(-1);  // members may attach; -1: owner and root only
};

class Server {
 public:
  Server(const ServerOptions& options, Park& park);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens (after claim_socket_path()); errno in ret_errno on failure.
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
    bool greeted = false;           // HELLO answered Ok
    bool closing = false;           // in closing_: read nothing more, send nothing more
    uint64_t accepted_usec = 0;     // CLOCK_MONOTONIC
  };

  void accept_all();
  // Makes room for a connection of (uid, pid) when its uid is at its cap: closes the
  // oldest idle connection of the uid's process that holds the most, if that holds
  // more than pid would with this one. Whether one was displaced.
  bool displace_for(uid_t uid, pid_t pid);
  bool peer_allowed(const ::ucred& cred) const;
  void on_readable(ConnectionId id);
  void on_writable(ConnectionId id);
  // Returns false when the connection must close.
  bool handle_frame(ConnectionId id, std::span<const uint8_t> message);
  // False when the connection is to close (close_later()): the peer is gone, or
  // does not read its replies.
  bool send_reply(ConnectionId id, std::vector<uint8_t>& frame, bool with_arena_fd);
  void close_connection(ConnectionId id);
  // Closes the connection once the event in hand is handled (close_pending()): a
  // reply that fails may be sent from inside Park (a WAIT answered as another request
  // settles its lease), which must not have the connection's state torn down under it.
  void close_later(ConnectionId id);
  void close_pending();
  bool open(ConnectionId id) const {
    const auto it = connections_.find(id);
    return it != connections_.end() && !it->second.closing;
  }
  void update_interest(ConnectionId id);
  // Closes connections that did not complete HELLO in time.
  void expire_handshakes();

  ServerOptions options_;
  Park& park_;
  int listen_fd_ = -1;
  ino_t socket_inode_ = 0;  // the socket file this daemon bound
  std::unordered_map<uid_t, size_t> per_uid_;
  std::unordered_map<pid_t, size_t> per_pid_;
  int epoll_fd_ = -1;
  int signal_fd_ = -1;
  ConnectionId next_id_ = 1;
  std::unordered_map<ConnectionId, Connection> connections_;
  std::vector<ConnectionId> closing_;
  std::vector<std::function<void()>> watches_;  // epoll token watch_token_base + index
  std::vector<uint8_t> receive_buffer_;
  bool stop_requested_ = false;
};

}  // namespace kvpark::daemon
