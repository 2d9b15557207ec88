// kvparkd's side of systemd's file descriptor store (sd_notify(3) FDSTORE=1,
// sd_listen_fds_with_names(3)).
//
// At start the daemon takes what the manager passed back (the arena's two memfds, the
// state segment and the index memory, by name) and, when it made new ones, stores them. Without
// $NOTIFY_SOCKET storing is a no-op and nothing is ever passed: a foreground daemon
// behaves as before. The unit sets FileDescriptorStoreMax= (systemd/kvparkd.service.in).
#pragma once

#include <string>

namespace kvpark::daemon {

inline constexpr const char* fd_name_arena_header = "kvpark-arena-header";
inline constexpr const char* fd_name_arena_data = "kvpark-arena-data";
inline constexpr const char* fd_name_state = "kvpark-state";
// The arena and what describes it: adopted together or dropped together.
inline constexpr const char* stored_fd_names[] = {fd_name_arena_header, fd_name_arena_data,
                                                  fd_name_state};
// Memory for the index (kept_memory.h): it holds no state, so it is kept whatever
// becomes of the arena.
inline constexpr const char* fd_name_index_memory = "kvpark-index-memory";

struct StoredFds {
  int arena_header = -1;
  int arena_data = -1;
  int state = -1;
  int index_memory = -1;  // not part of any() or complete(): it describes nothing
  size_t others = 0;  // passed under other names: closed
  bool any() const { return arena_header >= 0 || arena_data >= 0 || state >= 0; }
  bool complete() const { return arena_header >= 0 && arena_data >= 0 && state >= 0; }
};

// The fds passed at start under kvparkd's names (close-on-exec from now on); the
// LISTEN_* variables are unset so no child inherits them.
StoredFds take_stored_fds();
// Closes what take_stored_fds() returned and was not adopted (all but the index memory).
void close_stored_fds(StoredFds& fds);

// FDSTORE=1 with FDNAME=name; 0 when stored or no manager listens, else -errno.
int store_fd(const char* name, int fd);
// FDSTOREREMOVE=1 with FDNAME=name: the manager closes every fd of that name.
int remove_stored_fds(const char* name);
// A service manager is listening ($NOTIFY_SOCKET).
bool service_manager_present();

}  // namespace kvpark::daemon
