// kvparkd's start and stop steps, each logging what it did or why it failed, so
// that main() only wires the parts together (kvparkd(8) for the exit codes).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/control_plane.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_state.h"
#include "daemon/kept_memory.h"
#include "daemon/notify.h"
#include "daemon/options.h"
#include "daemon/park.h"
#include "daemon/pid_lock.h"
#include "daemon/remote_tier.h"
#include "daemon/server.h"
#include "iouring/disk_store.h"
#include "shm/arena.h"
#include "shm/state_segment.h"

namespace kvpark::daemon {

// Exit codes: 1 a start or loop failure, 2 a bad flag or config file (options.h),
// 3 another kvparkd already serves this socket or uses this disk directory.
inline constexpr int exit_failure = 1;
inline constexpr int exit_already_running = 3;

// A nonzero random 64-bit value; false (errno set) when getrandom keeps failing.
bool random_incarnation(uint64_t& ret_incarnation);

// Blocks SIGTERM, SIGINT and SIGHUP (they arrive through signalfds) and ignores
// SIGPIPE (a peer that went away is an EPIPE on its socket). False, errno set, if
// the kernel refused.
bool block_signals();
// A non-blocking signalfd for SIGHUP (reload, like `kvparkctl reload`); -1, errno set.
int open_reload_signal_fd();
// Reads every signal pending on a non-blocking signalfd; false, errno set, on an
// error other than "nothing more".
bool drain_signal_fd(int fd);

// SIGHUP: drains the signalfd, re-reads the configuration like `kvparkctl reload`,
// and tells the log and the service manager.
void reload_on_signal(int fd, DaemonOptions& options, Park& park, Notifier& notifier);
// The group whose members may attach; (gid_t)-1, nobody but root and the daemon's
// uid, when it does not exist (logged when the lookup itself failed).
gid_t attach_group_id(const std::string& name);

// Logs the runtime overrides the options were read with, or why they were not.
void log_overrides(const DaemonOptions& options);
// Makes the socket's directory and claims the socket path before the arena or the
// disk directory is touched (they may be another live daemon's); 0, or the exit code.
int claim_socket(const DaemonOptions& options, SocketClaim& ret_claim);
// Then the disk directory, if any: an flock on its kvparkd.lock, held until exit (two
// daemons spilling to one directory would remove each other's records and in-flight
// writes). 0, or the exit code. A directory this daemon cannot write is not claimed:
// it writes nothing there (open_disk_tier says why it serves it read-only or not).
inline constexpr std::string_view disk_lock_file_name = "kvparkd.lock";  // beside the fan-out
int claim_disk_directory(const DaemonOptions& options, PidLock& ret_lock);

// The arena and its state: adopted from what the service manager kept when that agrees
// with this configuration, else made new (and stored with the manager, when there is
// one). A fresh start over kept fds says why in one line and has the manager drop them.
// Under a manager, ret_index_memory is the memory the entry table's bulk is to come
// from (kept_memory.h), kept with the manager too; null without one.
bool open_host_tier(const DaemonOptions& options, std::unique_ptr<shm::ArenaOwner>& ret_arena,
                    std::unique_ptr<shm::StateSegment>& ret_state,
                    std::unique_ptr<KeptMemory>& ret_index_memory, bool& ret_adopted,
                    std::string& ret_fresh_reason);
// The remote tier, if configured; null (logged) when it cannot start. A store that is
// down is fine: the tier starts and picks the store up when it answers.
std::unique_ptr<RemoteTier> open_remote_tier(const DaemonOptions& options);
// The disk tier, if configured; null (logged, and why in ret_failure) when it cannot
// start: the host tier serves alone then.
std::unique_ptr<DiskTier> open_disk_tier(const DaemonOptions& options, shm::ArenaOwner& arena,
                                         disk::RecoveryReport& ret_recovery,
                                         std::string& ret_failure);
// Indexes what the disk tier found at start, and says so.
void recover_disk(Park& park, const DiskTier& disk, const disk::RecoveryReport& recovery);
// A planned restart keeps what is worth keeping: writes it to disk first, within
// shutdown_flush_timeout_usec, while systemd's watchdog keeps being fed.
inline constexpr uint64_t shutdown_flush_timeout_usec = 120'000'000;
void spill_before_stopping(Park& park, DiskTier& disk, Notifier& notifier);
// After the loop: keeps the engines' pids for the next instance (they may still copy
// out of their leases), closes the connections, spills before stopping (when
// configured) and saves the day's disk writes.
void stop_core(const DaemonOptions& options, Server& server, Park& park, EntryState* entry_state,
               Notifier& notifier);

// What the loop does between events: the core's tick (WAIT deadlines, low water,
// flushes), watchdog pings, saving the day's disk writes, and a STATUS= line for
// systemctl status. Server::run's tick callback.
struct LoopTicker {
  static constexpr uint64_t status_interval_usec = 10'000'000;
  Park& park;
  ControlPlane& control;
  Notifier& notifier;
  uint64_t last_status_usec = 0;

  static void run(void* context);
};

}  // namespace kvpark::daemon
