// An flock on a lock file that names the holder's pid: one daemon per socket path
// (server.h) and per disk directory (startup.h). The kernel drops the lock when its
// holder exits, however it exits, so a crashed daemon never blocks the next one.
#pragma once

#include <sys/types.h>

#include <string>

#include "proto/status.h"

namespace kvpark::daemon {

struct PidLock {
  int fd = -1;          // held until closed (or exit)
  pid_t other_pid = 0;  // AlreadyPresent: the holder, as its file says (0: unknown)
};

// Creates `path` if missing and takes its lock without waiting. AlreadyPresent when
// another process holds it; IoError with ret_errno otherwise.
Status take_pid_lock(const std::string& path, PidLock& ret_lock, int& ret_errno);
// Writes this process's pid into a held lock's file, for the next one refused.
bool write_pid(int lock_fd);

}  // namespace kvpark::daemon
