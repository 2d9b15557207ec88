// libkvpark's connection to kvparkd: one request in flight at a time, with
// reconnection after a daemon restart.
//
// A Channel owns the socket and the arena mapping of the current daemon
// incarnation; a daemon that adopted the same arena (the service manager kept it)
// is mapped through the same mapping. Each successful (re)connection bumps `generation`; leases and
// reservations remember the generation they were made in, and verbs about them
// are not sent to a newer incarnation, which never heard of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "proto/wire.h"
#include "shm/arena.h"

namespace kvpark::client {

inline constexpr int reply_timeout_msec = 30'000;  // a daemon silent this long is gone
// The shortest a client may choose (kvpark_connect_with_reply_timeout): well above one
// WAIT slice (limits::wait_slice_msec), the longest a healthy daemon keeps a reply.
inline constexpr int reply_timeout_msec_min = 1'000;
// After a daemon stayed silent a whole reply timeout (stopped, hung), calls fail at
// once for this long instead of each waiting the timeout out again, one after another
// behind the channel's lock. A daemon that is down fails fast anyway (no backoff).
inline constexpr int silent_daemon_backoff_msec = 5'000;
// A connect the daemon refuses for its connection caps (LimitExceeded: the uid's share
// is busy, or the daemon is full) is tried again, backing off from the first to the
// last interval, for at most this long (and never past the reply timeout): a slot
// freed by another process's churn is taken instead of failing the engine's request.
inline constexpr int admission_retry_msec_max = 2'000;
inline constexpr int admission_backoff_msec_first = 2;
inline constexpr int admission_backoff_msec_last = 100;

struct Attachment {  // what one HELLO gave us
  wire::HelloReply hello;
  std::shared_ptr<shm::ArenaMapping> mapping;
  uint64_t generation = 0;
};

struct ReceivedFds {  // passed with a reply (SCM_RIGHTS)
  static constexpr size_t fds_max = 2;
  int fds[fds_max] = {-1, -1};
  size_t count = 0;
};

class Channel {
 public:
  Channel(std::string socket_path, wire::HelloRequest hello,
          int reply_timeout_msec = client::reply_timeout_msec);
  ~Channel();

  // Connects now (used once by kvpark_connect so a missing daemon is reported at once).
  Status connect(Attachment& ret_attachment);

  // Sends `request` (a whole encoded frame) and waits for its reply. When
  // `generation` is nonzero the call is only made on that generation's connection
  // (Unavailable otherwise); when zero, a lost connection is re-established once.
  // ret_status: the daemon's answer; ret_body: the reply body. `opens_grant`: a
  // LOOKUP for a new plan or a RESERVE, counted open (under the lock, so no
  // reconnection can come between the grant and the count) when it is answered Ok.
  Status call(std::vector<uint8_t>& request, uint64_t generation, Status& ret_status,
              std::vector<uint8_t>& ret_body, Attachment& ret_attachment, bool opens_grant = false);
  // A plan or reservation counted by call(opens_grant) is finished. While any is open a
  // reconnection tells the daemon (HELLO) that this client may still read its previous
  // arena leases or write into its previous reservations.
  void grant_closed();
  // Sends a request that has no reply (RELEASE_ONE_WAY) on that generation's connection.
  Status send_one_way(std::vector<uint8_t>& request, uint64_t generation);
  // Closes the connection (the daemon then ends its leases and reservations); the
  // next call reconnects. For a reply that granted something the caller cannot keep.
  void drop();

 private:
  Status connect_locked();
  Status connect_once_locked();
  bool backing_off_locked() const;  // a silent daemon is being left alone
  void note_silence_locked();
  void drop_locked();
  Status round_trip_locked(std::vector<uint8_t>& request, Status& ret_status,
                           std::vector<uint8_t>& ret_body, ReceivedFds* ret_fds);

  std::mutex mutex_;
  std::string socket_path_;
  const int reply_timeout_msec_;
  // Set by a send, connect or reply that ran into the timeout; when it was last.
  bool silent_ = false;
  std::chrono::steady_clock::time_point silent_since_{};
  wire::HelloRequest hello_;
  int fd_ = -1;
  Attachment attachment_;
  // The mapping of the connection last dropped, kept until the next HELLO says
  // whether its daemon adopted the same arena (while no daemon answers, the old
  // arena's memory stays mapped here, as it did for a client holding a plan).
  std::shared_ptr<shm::ArenaMapping> last_mapping_;
  uint64_t generations_ = 0;
  uint64_t open_grants_ = 0;
  uint32_t sequence_ = 0;
  std::vector<uint8_t> receive_buffer_;
};

}  // namespace kvpark::client
