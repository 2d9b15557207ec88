// kvparkd's start and stop steps (see startup.h).
#include "daemon/startup.h"

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "daemon/adoption.h"
#include "daemon/clock.h"
#include "daemon/config.h"
#include "daemon/fd_store.h"
#include "daemon/log.h"
#include "proto/size.h"
#include "shm/mapping.h"

namespace kvpark::daemon {

namespace {

constexpr int incarnation_attempts_max = 8;  // getrandom: EINTR, or a zero draw

// The arena with the operator's huge-page setting; logs what it got or why it failed.
bool create_arena(const DaemonOptions& options, uint64_t incarnation,
                  std::unique_ptr<shm::ArenaOwner>& ret_arena) {
  int err = 0;
  shm::ArenaOptions arena_options{.name = options.arena_name,
                                  .data_bytes = options.arena_bytes,
                                  .incarnation = incarnation,
                                  .huge_pages = options.huge_pages};
  shm::ArenaCreation creation;
  if (Status s = shm::ArenaOwner::create(arena_options, ret_arena, err, &creation); s != Status::Ok) {
    if (options.huge_pages == shm::HugePages::On) {
      log_error("kvparkd: huge_pages = on, but no %llu-byte hugetlb arena could be made (%s): reserve "
                "huge pages with the sysctl vm.nr_hugepages (see kvparkd.conf(5)), or set huge_pages = try",
                static_cast<unsigned long long>(options.arena_bytes), strerror(err));
    } else {
      log_error("kvparkd: cannot create a %llu-byte arena '%s': %s (%s)",
                static_cast<unsigned long long>(options.arena_bytes), options.arena_name.c_str(),
                std::string(status_name(s)).c_str(), strerror(err));
    }
    return false;
  }
  if (options.huge_pages == shm::HugePages::Try && creation.pages != shm::ArenaPages::Hugetlb) {
    log_notice("kvparkd: arena on %s pages: no hugetlb pages (%s; vm.nr_hugepages reserves them)%s",
               creation.pages == shm::ArenaPages::Transparent ? "transparent 2 MiB" : "4 KiB",
               strerror(creation.hugetlb_errno),
               creation.transparent_allowed ? ""
                                            : ", and transparent huge pages are off for shmem "
                                              "(/sys/kernel/mm/transparent_hugepage/shmem_enabled)");
  }
  return true;
}

// `what` (a socket path or a disk directory) is another live daemon's: one line, exit 3.
int refuse_start(const std::string& what, pid_t other_pid) {
  if (other_pid > 0) {
    log_error("kvparkd: %s by another kvparkd (pid %d); not starting", what.c_str(),
              static_cast<int>(other_pid));
  } else {
    log_error("kvparkd: %s by another kvparkd; not starting", what.c_str());
  }
  return exit_already_running;
}

}  // namespace

bool random_incarnation(uint64_t& ret_incarnation) {
  for (int attempt = 0; attempt < incarnation_attempts_max; ++attempt) {
    uint64_t value = 0;
    const ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == sizeof value && value != 0) {
      ret_incarnation = value;
      return true;
    }
    if (n < 0 && errno != EINTR) return false;
  }
  errno = EAGAIN;
  return false;
}

bool block_signals() {
  sigset_t mask;
  if (sigemptyset(&mask) != 0 || sigaddset(&mask, SIGTERM) != 0 || sigaddset(&mask, SIGINT) != 0 ||
      sigaddset(&mask, SIGHUP) != 0) {  // SIGHUP: reload, through open_reload_signal_fd()
    return false;
  }
  return sigprocmask(SIG_BLOCK, &mask, nullptr) == 0 && signal(SIGPIPE, SIG_IGN) != SIG_ERR;
}

int open_reload_signal_fd() {
  sigset_t hup;
  if (sigemptyset(&hup) != 0 || sigaddset(&hup, SIGHUP) != 0) return -1;
  return signalfd(-1, &hup, SFD_NONBLOCK | SFD_CLOEXEC);
}

bool drain_signal_fd(int fd) {
  for (;;) {
    signalfd_siginfo info{};
    const ssize_t n = read(fd, &info, sizeof info);
    if (n == sizeof info) continue;
    if (n < 0 && errno == EINTR) continue;
    if (n >= 0) errno = EIO;  // a short read: not a signalfd
    return n < 0 && errno == EAGAIN;
  }
}

void reload_on_signal(int fd, DaemonOptions& options, Park& park, Notifier& notifier) {
  if (!drain_signal_fd(fd)) log_warning("kvparkd: reading the SIGHUP signalfd: %s", strerror(errno));
  notifier.reloading();
  std::string message;
  reload_options(options, park, message);
  log_notice("kvparkd: %s", message.c_str());
  notifier.reloaded(message);
}

gid_t attach_group_id(const std::string& name) {
  errno = 0;
  const group* g = getgrnam(name.c_str());
  if (g != nullptr) return g->gr_gid;
  // No such group is errno 0 or one of these (getgrnam(3)); anything else is a failure.
  if (errno != 0 && errno != ENOENT && errno != ESRCH && errno != EBADF && errno != EPERM) {
    log_warning("kvparkd: cannot look up the attach group %s: %s", name.c_str(), strerror(errno));
  }
  return static_cast<gid_t>(-1);
}

void log_overrides(const DaemonOptions& options) {
  if (!options.overrides_warning.empty()) {
    log_warning("kvparkd: %s", options.overrides_warning.c_str());
  } else if (!options.override_values.empty()) {
    std::string keys;
    for (const auto& [key, value] : options.override_values)
      keys += (keys.empty() ? "" : ", ") + key + " = " + value;
    log_notice("kvparkd: runtime overrides from %s: %s", runtime_overrides_path(options).c_str(),
               keys.c_str());
  }
}

int claim_socket(const DaemonOptions& options, SocketClaim& ret_claim) {
  const std::filesystem::path directory = std::filesystem::path(options.socket_path).parent_path();
  std::error_code ec;
  if (!directory.empty() && !std::filesystem::create_directories(directory, ec) && ec) {
    // Claiming the path below says whether the daemon can go on without it.
    log_warning("kvparkd: cannot make %s: %s", directory.c_str(), ec.message().c_str());
  }
  int err = 0;
  const Status s = claim_socket_path(options.socket_path, ret_claim, err);
  if (s == Status::Ok) return 0;
  if (s == Status::AlreadyPresent)
    return refuse_start(options.socket_path + " is served", ret_claim.other_pid);
  log_error("kvparkd: cannot lock %s.lock: %s", options.socket_path.c_str(), strerror(err));
  return exit_failure;
}

int claim_disk_directory(const DaemonOptions& options, PidLock& ret_lock) {
  if (options.disk_directory.empty()) return 0;
  // The disk tier makes the directory too; the lock file needs it first.
  (void)mkdir(options.disk_directory.c_str(), 0750);
  const std::string path = options.disk_directory + "/" + std::string(disk_lock_file_name);
  int err = 0;
  const Status s = take_pid_lock(path, ret_lock, err);
  if (s == Status::Ok) {
    if (!write_pid(ret_lock.fd))
      log_warning("kvparkd: cannot write the pid to %s: %s", path.c_str(), strerror(errno));
    return 0;
  }
  if (s == Status::AlreadyPresent)
    return refuse_start("disk directory " + options.disk_directory + " is used",
                        ret_lock.other_pid);
  // Not writable here (read-only, or missing): the disk tier then writes nothing there.
  if (err != EACCES && err != EPERM && err != EROFS && err != ENOENT)
    log_warning("kvparkd: cannot lock %s: %s", path.c_str(), strerror(err));
  return 0;
}

void LoopTicker::run(void* context) {
  LoopTicker& t = *static_cast<LoopTicker*>(context);
  t.park.tick();
  const uint64_t now = monotonic_usec();
  t.notifier.tick(now);
  if (DiskTier* disk = t.park.disk(); disk != nullptr && !disk->save_budget(now, false)) {
    log_warning_limited("kvparkd: cannot save the day's disk writes to %s: %s",
                        disk->budget_path().c_str(), strerror(errno));
  }
  if (now - t.last_status_usec >= status_interval_usec) {
    t.last_status_usec = now;
    const StatusInfo s = t.control.status_in_loop();
    t.notifier.status(std::to_string(s.connections) + " engines, " + std::to_string(s.entries) +
                      " entries, arena " + std::to_string(s.arena_used_bytes >> 20) + " of " +
                      std::to_string(s.arena_data_bytes >> 20) + " MiB used");
  }
}

std::unique_ptr<RemoteTier> open_remote_tier(const DaemonOptions& options) {
  std::unique_ptr<RemoteTier> tier;
  if (options.remote.empty()) return tier;
  RemoteTierOptions remote_options{
      .user = options.remote_user,
      .write_policy = options.remote_write == "all"   ? RemoteWritePolicy::All
                      : options.remote_write == "off" ? RemoteWritePolicy::Off
                                                      : RemoteWritePolicy::Shared};
  if (remote::parse_endpoints(options.remote, remote_options.seeds) != Status::Ok) return tier;
  if (!options.remote_password_file.empty()) {
    std::ifstream in(options.remote_password_file);
    if (!in || !std::getline(in, remote_options.password)) {
      log_error("kvparkd: remote tier off: cannot read its password from %s: %s",
                options.remote_password_file.c_str(), strerror(errno));
      return tier;
    }
    while (!remote_options.password.empty() && (remote_options.password.back() == '\r')) {
      remote_options.password.pop_back();
    }
  }
  if (RemoteTier::open(remote_options, tier) != Status::Ok) {
    log_error("kvparkd: remote tier off: cannot start its worker: %s", strerror(errno));
    return tier;
  }
  log_info("kvparkd: remote tier %s, writing %s entries behind", tier->seeds_text().c_str(),
           remote_write_name(remote_options.write_policy));
  return tier;
}

std::unique_ptr<DiskTier> open_disk_tier(const DaemonOptions& options, shm::ArenaOwner& arena,
                                         disk::RecoveryReport& ret_recovery,
                                         std::string& ret_failure) {
  std::unique_ptr<DiskTier> disk;
  if (options.disk_directory.empty()) return disk;
  disk::OpenError open_error;
  DiskTierOptions disk_options{
      .directory = options.disk_directory,
      .capacity_bytes = options.disk_capacity_bytes,
      .write_budget_bytes_per_day = options.disk_write_budget_bytes_per_day,
      .fixed_buffers = {iovec{arena.data(), arena.data_bytes()}}};
  if (Status s = DiskTier::open(disk_options, disk, ret_recovery, open_error);
      s != Status::Ok) {
    ret_failure = options.disk_directory + ": " + std::string(status_name(s)) + ": " +
                  open_error.detail +
                  (open_error.err != 0 ? std::string(": ") + strerror(open_error.err) : "");
    log_error("kvparkd: disk tier off, serving from memory only: %s: %s%s%s",
              std::string(status_name(s)).c_str(), open_error.detail.c_str(),
              open_error.err != 0 ? ": " : "", open_error.err != 0 ? strerror(open_error.err) : "");
  }
  return disk;
}

void recover_disk(Park& park, const DiskTier& disk, const disk::RecoveryReport& recovery) {
  const uint64_t skipped = park.recover(recovery);
  log_info("kvparkd: disk tier at %s: %zu records recovered in %llu ms (%llu skipped, of "
           "which %llu unreachable and removed; %llu interrupted writes removed, %llu damaged "
           "files removed, %llu of another format version left alone)%s",
           disk.directory().c_str(), recovery.records.size() - skipped,
           static_cast<unsigned long long>(recovery.scan_usec / 1000),
           static_cast<unsigned long long>(skipped),
           static_cast<unsigned long long>(park.counters().unreachable_records_removed),
           static_cast<unsigned long long>(recovery.temp_files_removed),
           static_cast<unsigned long long>(recovery.garbage_removed),
           static_cast<unsigned long long>(recovery.other_version_records),
           recovery.fixed_buffers_registered ? "" : "; arena not registered with io_uring");
  for (const std::string& note : recovery.engine_notes) {
    log_notice("kvparkd: io_uring: %s", note.c_str());
  }
  if (disk.written_today_bytes() > 0) {
    log_info("kvparkd: disk tier wrote %s today before this start (%s)",
             format_size(disk.written_today_bytes()).c_str(),
             disk.write_budget_bytes_per_day() == 0
                 ? "no daily budget"
                 : ("budget " + format_size(disk.write_budget_bytes_per_day()) + " a day")
                       .c_str());
  }
  if (disk.read_only()) {
    log_warning("kvparkd: disk tier at %s is read-only: its records are served, nothing is "
                "spilled or removed there",
                disk.directory().c_str());
  }
}

void spill_before_stopping(Park& park, DiskTier& disk, Notifier& notifier) {
  uint64_t job = 0;
  if (Status s = park.start_flush(false, job); s != Status::Ok) {
    log_error("kvparkd: no spill before stopping: %s", std::string(status_name(s)).c_str());
    return;
  }
  const uint64_t deadline = monotonic_usec() + shutdown_flush_timeout_usec;
  while (!park.flush_state().done && monotonic_usec() < deadline) {
    pollfd p{disk.store().notify_fd(), POLLIN, 0};
    const int ready = poll(&p, 1, 100);
    if (ready < 0 && errno != EINTR) {
      log_error("kvparkd: spill before stopping: poll: %s", strerror(errno));
      break;
    }
    if (ready > 0) park.on_disk_completions();
    park.tick();
    notifier.tick(monotonic_usec());
  }
  const FlushState& f = park.flush_state();
  log_info("kvparkd: wrote %llu of %llu entries (%llu MiB) to disk before stopping%s",
           static_cast<unsigned long long>(f.entries_done),
           static_cast<unsigned long long>(f.entries_total),
           static_cast<unsigned long long>(f.bytes_done >> 20), f.done ? "" : " (timed out)");
}

namespace {

// kept_memory_dir when a new file can be made there (a tmpfs: see
// shm::create_tmpfs_file()); else empty, and one line says why memfds serve instead.
std::string usable_kept_memory_directory(const std::string& directory) {
  if (directory.empty()) return directory;
  const int fd = shm::create_tmpfs_file(directory);
  if (fd < 0) {
    log_warning(
        "kvparkd: kept_memory_dir %s cannot hold the state segment and index memory (%s): "
        "memfds instead",
        directory.c_str(), errno == ENOTSUP ? "not a tmpfs" : strerror(errno));
    return {};
  }
  close(fd);
  return directory;
}

// Under a service manager (or over memory one kept), the memory the entry table's
// bulk comes from; null when there is neither, or none can be made (logged).
std::unique_ptr<KeptMemory> open_index_memory(int kept_fd, shm::HugePages huge_pages,
                                              const std::string& directory) {
  if (kept_fd < 0 && !service_manager_present()) return nullptr;
  std::unique_ptr<KeptMemory> memory;
  int err = 0;
  if (KeptMemory::open(kept_fd, huge_pages != shm::HugePages::Off, memory, err, directory) !=
      Status::Ok) {
    log_warning(
        "kvparkd: no index memory to keep (%s): a restart rebuilds the index in fresh memory",
        strerror(err));
    return nullptr;
  }
  if (memory->kept()) {
    log_info("kvparkd: reusing %llu MiB of index memory kept by the previous instance",
             static_cast<unsigned long long>(memory->kept_bytes() >> 20));
    return memory;
  }
  if (memory->huge_pages()) log_info("kvparkd: index memory on reserved huge pages");
  if (memory->transparent_pages()) log_info("kvparkd: index memory on transparent huge pages");
  if (kept_fd >= 0) (void)remove_stored_fds(fd_name_index_memory);  // it could not serve
  if (const int r = store_fd(fd_name_index_memory, memory->fd()); r < 0) {
    log_warning("kvparkd: cannot keep the index memory with the service manager (%s)",
                strerror(-r));
  }
  return memory;
}

}  // namespace

bool open_host_tier(const DaemonOptions& options, std::unique_ptr<shm::ArenaOwner>& ret_arena,
                    std::unique_ptr<shm::StateSegment>& ret_state,
                    std::unique_ptr<KeptMemory>& ret_index_memory, bool& ret_adopted,
                    std::string& ret_fresh_reason) {
  ret_adopted = false;
  StoredFds stored = take_stored_fds();
  // Opened after the arena and the state segment: with huge pages allowed it may take
  // reserved huge pages, which the arena, sized by the operator, comes first for.
  const int kept_index_memory = std::exchange(stored.index_memory, -1);
  // Where new state and index memory go, checked once: a kept fd stays where it is. It
  // is there for its huge pages: with huge_pages = off, memfds on 4 KiB pages as asked.
  const bool keeping = service_manager_present() || kept_index_memory >= 0;
  const std::string kept_directory =
      keeping && options.huge_pages != shm::HugePages::Off
          ? usable_kept_memory_directory(options.kept_memory_directory)
          : std::string();
  KeptArena kept;
  std::string& fresh_reason = ret_fresh_reason;
  if (take_over(stored, {.configured_arena_bytes = options.arena_bytes, .huge_pages = options.huge_pages},
                        kept, fresh_reason)) {
    ret_arena = std::move(kept.arena);
    ret_state = std::move(kept.state);
    ret_adopted = true;
    ret_index_memory = open_index_memory(kept_index_memory, options.huge_pages, kept_directory);
    return true;
  }
  if (!fresh_reason.empty()) {
    log_notice("kvparkd: starting with an empty arena: %s", fresh_reason.c_str());
    for (const char* name : stored_fd_names) (void)remove_stored_fds(name);
  }
  uint64_t arena_identity = 0;
  if (!random_incarnation(arena_identity)) {
    log_error("kvparkd: no random arena identity from getrandom: %s", strerror(errno));
    return false;
  }
  if (!create_arena(options, arena_identity, ret_arena)) {
    if (kept_index_memory >= 0) close(kept_index_memory);
    return false;
  }
  int err = 0;
  if (shm::StateSegment::create({.arena_identity = arena_identity,
                                 .arena_data_bytes = ret_arena->data_bytes(),
                                 .configured_arena_bytes = options.arena_bytes,
                                 .huge_pages = static_cast<uint16_t>(options.huge_pages)},
                                ret_state, err, kept_directory) != Status::Ok) {
    log_warning("kvparkd: no state segment (%s): a restart will start with an empty arena", strerror(err));
    ret_index_memory = open_index_memory(kept_index_memory, options.huge_pages, kept_directory);
    return true;
  }
  if (ret_state->on_huge_pages()) log_info("kvparkd: state segment on reserved huge pages");
  if (ret_state->on_transparent_pages())
    log_info("kvparkd: state segment on transparent huge pages");
  ret_index_memory = open_index_memory(kept_index_memory, options.huge_pages, kept_directory);
  if (!service_manager_present()) return true;
  const int fds[] = {ret_arena->header_fd(), ret_arena->data_fd(), ret_state->fd()};
  for (size_t i = 0; i < std::size(fds); ++i) {
    if (const int r = store_fd(stored_fd_names[i], fds[i]); r < 0) {
      log_warning("kvparkd: cannot keep the arena with the service manager (%s): a restart will start "
                  "with an empty arena",
                  strerror(-r));
      break;
    }
  }
  return true;
}

void stop_core(const DaemonOptions& options, Server& server, Park& park, EntryState* entry_state,
               Notifier& notifier) {
  // Engines may still copy out of their leases or into their reservations: the next
  // instance waits for them.
  if (entry_state != nullptr) entry_state->freeze();
  server.close_connections();
  DiskTier* disk = park.disk();
  if (disk != nullptr && options.spill_on_shutdown) spill_before_stopping(park, *disk, notifier);
  if (disk != nullptr && !disk->save_budget(monotonic_usec(), true)) {
    log_error("kvparkd: cannot save the day's disk writes to %s: %s", disk->budget_path().c_str(),
              strerror(errno));
  }
}

}  // namespace kvpark::daemon
