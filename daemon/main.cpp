// kvparkd: wires the arena, the entry table, the core and the socket server.
#include <grp.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <poll.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "daemon/adoption.h"
#include "daemon/clock.h"
#include "daemon/config.h"
#include "daemon/control_plane.h"
#include "daemon/dbus_adapter.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/fd_store.h"
#include "daemon/http_adapter.h"
#include "daemon/loop_queue.h"
#include "daemon/log.h"
#include "daemon/notify.h"
#include "daemon/options.h"
#include "daemon/park.h"
#include "daemon/remote_tier.h"
#include "daemon/server.h"
#include "proto/limits.h"
#include "proto/version.h"
#include "shm/arena.h"
#include "shm/arena_guard.h"
#include "shm/state_segment.h"

using namespace kvpark;
using daemon::monotonic_usec;

namespace {

constexpr int tick_msec = 50;  // WAIT deadlines are honoured to this resolution
constexpr uint64_t shutdown_flush_timeout_usec = 120'000'000;
// Exit codes (kvparkd(8)): 1 a start or loop failure, 2 a bad flag or config file,
// 3 another kvparkd already serves this socket.
constexpr int exit_failure = 1;
constexpr int exit_already_running = 3;

constexpr int incarnation_attempts_max = 8;  // getrandom: EINTR, or a zero draw

// A nonzero random incarnation; false (errno set) when getrandom keeps failing.
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

// SIGTERM, SIGINT and SIGHUP arrive through signalfds, SIGPIPE is ignored (a peer that
// went away is an EPIPE on its socket). False, errno set, if the kernel refused.
bool setup_signals() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);  // reload, through open_reload_signal_fd()
  return sigprocmask(SIG_BLOCK, &mask, nullptr) == 0 && signal(SIGPIPE, SIG_IGN) != SIG_ERR;
}

// What the loop does between events: low-water eviction, watchdog pings and a
// STATUS= line for systemctl status.
struct Ticker {
  static constexpr uint64_t status_interval_usec = 10'000'000;
  daemon::Park& park;
  daemon::ControlPlane& control;
  daemon::Notifier& notifier;
  uint64_t last_status_usec = 0;

  static void run(void* context) {
    Ticker& t = *static_cast<Ticker*>(context);
    t.park.tick();
    const uint64_t now = monotonic_usec();
    t.notifier.tick(now);
    if (daemon::DiskTier* disk = t.park.disk(); disk != nullptr && !disk->save_budget(now, false)) {
      log_warning_limited("kvparkd: cannot save the day's disk writes to %s: %s",
                          disk->budget_path().c_str(), strerror(errno));
    }
    if (now - t.last_status_usec >= status_interval_usec) {
      t.last_status_usec = now;
      const daemon::StatusInfo s = t.control.status_in_loop();
      t.notifier.status(std::to_string(s.connections) + " engines, " + std::to_string(s.entries) +
                        " entries, arena " + std::to_string(s.arena_used_bytes >> 20) + " of " +
                        std::to_string(s.arena_data_bytes >> 20) + " MiB used");
    }
  }
};

// SIGHUP re-reads the configuration, like `kvparkctl reload`.
int open_reload_signal_fd() {
  sigset_t hup;
  sigemptyset(&hup);
  sigaddset(&hup, SIGHUP);
  return signalfd(-1, &hup, SFD_NONBLOCK | SFD_CLOEXEC);
}


// The disk tier, if configured; null (logged, and why in ret_failure) when it cannot
// start: the host tier serves alone then.
std::unique_ptr<daemon::DiskTier> open_disk_tier(const daemon::DaemonOptions& options,
                                                 shm::ArenaOwner& arena,
                                                 disk::RecoveryReport& ret_recovery,
                                                 std::string& ret_failure) {
  std::unique_ptr<daemon::DiskTier> disk;
  if (options.disk_directory.empty()) return disk;
  disk::OpenError open_error;
  daemon::DiskTierOptions disk_options{
      .directory = options.disk_directory,
      .capacity_bytes = options.disk_capacity_bytes,
      .write_budget_bytes_per_day = options.disk_write_budget_bytes_per_day,
      .fixed_buffers = {iovec{arena.data(), arena.data_bytes()}}};
  if (Status s = daemon::DiskTier::open(disk_options, disk, ret_recovery, open_error);
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

// The remote tier, if configured; null (logged) when it cannot start. A store that is
// down is fine: the tier starts and picks the store up when it answers.
std::unique_ptr<daemon::RemoteTier> open_remote_tier(const daemon::DaemonOptions& options) {
  std::unique_ptr<daemon::RemoteTier> tier;
  if (options.remote.empty()) return tier;
  daemon::RemoteTierOptions remote_options{
      .user = options.remote_user,
      .write_policy = options.remote_write == "all"   ? daemon::RemoteWritePolicy::All
                      : options.remote_write == "off" ? daemon::RemoteWritePolicy::Off
                                                      : daemon::RemoteWritePolicy::Shared};
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
  if (daemon::RemoteTier::open(remote_options, tier) != Status::Ok) {
    log_error("kvparkd: remote tier off: cannot start its worker: %s", strerror(errno));
    return tier;
  }
  log_info("kvparkd: remote tier %s, writing %s entries behind", tier->seeds_text().c_str(),
           daemon::remote_write_name(remote_options.write_policy));
  return tier;
}

// Indexes what the disk tier found at start, and says so.
void recover_disk(daemon::Park& park, const daemon::DiskTier& disk,
                  const disk::RecoveryReport& recovery) {
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
             daemon::format_size(disk.written_today_bytes()).c_str(),
             disk.write_budget_bytes_per_day() == 0
                 ? "no daily budget"
                 : ("budget " + daemon::format_size(disk.write_budget_bytes_per_day()) + " a day")
                       .c_str());
  }
  if (disk.read_only()) {
    log_warning("kvparkd: disk tier at %s is read-only: its records are served, nothing is "
                "spilled or removed there",
                disk.directory().c_str());
  }
}

// The arena with the operator's huge-page setting; logs what it got or why it failed.
bool create_arena(const daemon::DaemonOptions& options, uint64_t incarnation,
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

// HTTP status and metrics, unless turned off; a failure to listen is logged, not fatal.
// Returns "HOST:PORT" as bound (port 0 resolved), for READY's STATUS=; empty when off.
std::string start_http(daemon::HttpAdapter& http, const std::string& listen) {
  if (listen.empty()) return "";
  std::string host;
  uint16_t port = 0;
  std::string http_error;
  daemon::parse_listen_address(listen, host, port);
  if (!http.start(host, port, http_error)) {
    log_error("kvparkd: no HTTP status or metrics: %s", http_error.c_str());
    return "";
  }
  const bool v6 = host.find(':') != std::string::npos;
  const std::string bound = (v6 ? "[" + host + "]" : host) + ":" + std::to_string(http.port());
  log_info("kvparkd: http listening on %s", bound.c_str());
  return bound;
}

// A planned restart keeps what is worth keeping: writes it to disk first, within
// shutdown_flush_timeout_usec, while systemd's watchdog keeps being fed.
void spill_before_stopping(daemon::Park& park, daemon::DiskTier& disk,
                           daemon::Notifier& notifier) {
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
  const daemon::FlushState& f = park.flush_state();
  log_info("kvparkd: wrote %llu of %llu entries (%llu MiB) to disk before stopping%s",
           static_cast<unsigned long long>(f.entries_done),
           static_cast<unsigned long long>(f.entries_total),
           static_cast<unsigned long long>(f.bytes_done >> 20), f.done ? "" : " (timed out)");
}

// The arena and its state: adopted from what the service manager kept when that agrees
// with this configuration, else made new (and stored with the manager, when there is
// one). A fresh start over kept fds says why in one line and has the manager drop them.
bool open_host_tier(const daemon::DaemonOptions& options, std::unique_ptr<shm::ArenaOwner>& ret_arena,
                    std::unique_ptr<shm::StateSegment>& ret_state, bool& ret_adopted,
                    std::string& ret_fresh_reason) {
  ret_adopted = false;
  daemon::StoredFds stored = daemon::take_stored_fds();
  daemon::KeptArena kept;
  std::string& fresh_reason = ret_fresh_reason;
  if (daemon::take_over(stored, {.configured_arena_bytes = options.arena_bytes, .huge_pages = options.huge_pages},
                        kept, fresh_reason)) {
    ret_arena = std::move(kept.arena);
    ret_state = std::move(kept.state);
    ret_adopted = true;
    return true;
  }
  if (!fresh_reason.empty()) {
    log_notice("kvparkd: starting with an empty arena: %s", fresh_reason.c_str());
    for (const char* name : daemon::stored_fd_names) (void)daemon::remove_stored_fds(name);
  }
  uint64_t arena_identity = 0;
  if (!random_incarnation(arena_identity)) {
    log_error("kvparkd: no random arena identity from getrandom: %s", strerror(errno));
    return false;
  }
  if (!create_arena(options, arena_identity, ret_arena)) return false;
  int err = 0;
  if (shm::StateSegment::create({.arena_identity = arena_identity,
                                 .arena_data_bytes = ret_arena->data_bytes(),
                                 .configured_arena_bytes = options.arena_bytes,
                                 .huge_pages = static_cast<uint16_t>(options.huge_pages)},
                                ret_state, err) != Status::Ok) {
    log_warning("kvparkd: no state segment (%s): a restart will start with an empty arena", strerror(err));
    return true;
  }
  if (!daemon::service_manager_present()) return true;
  const int fds[] = {ret_arena->header_fd(), ret_arena->data_fd(), ret_state->fd()};
  for (size_t i = 0; i < std::size(fds); ++i) {
    if (const int r = daemon::store_fd(daemon::stored_fd_names[i], fds[i]); r < 0) {
      log_warning("kvparkd: cannot keep the arena with the service manager (%s): a restart will start "
                  "with an empty arena",
                  strerror(-r));
      break;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  daemon::DaemonOptions options;
  int exit_code = 0;
  if (!daemon::parse_options(argc, argv, options, exit_code)) return exit_code;
  if (!options.overrides_warning.empty()) {
    log_warning("kvparkd: %s", options.overrides_warning.c_str());
  } else if (!options.override_values.empty()) {
    std::string keys;
    for (const auto& [key, value] : options.override_values)
      keys += (keys.empty() ? "" : ", ") + key + " = " + value;
    log_notice("kvparkd: runtime overrides from %s: %s",
               daemon::runtime_overrides_path(options).c_str(), keys.c_str());
  }

  if (!setup_signals()) {
    log_error("kvparkd: cannot set up signal handling: %s", strerror(errno));
    return exit_failure;
  }

  // First, before the arena name or the disk directory is touched: they may be
  // another live daemon's.
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(options.socket_path).parent_path(),
                                      ec);
  daemon::SocketClaim claim;
  int err = 0;
  if (Status s = daemon::claim_socket_path(options.socket_path, claim, err); s != Status::Ok) {
    if (s == Status::AlreadyPresent) {
      if (claim.other_pid > 0) {
        log_error("kvparkd: %s is served by another kvparkd (pid %d); not starting",
                  options.socket_path.c_str(), static_cast<int>(claim.other_pid));
      } else {
        log_error("kvparkd: %s is served by another kvparkd; not starting",
                  options.socket_path.c_str());
      }
      return exit_already_running;
    }
    log_error("kvparkd: cannot lock %s.lock: %s", options.socket_path.c_str(), strerror(err));
    return exit_failure;
  }

  uint64_t incarnation = 0;
  if (!random_incarnation(incarnation)) {
    log_error("kvparkd: no random incarnation from getrandom: %s", strerror(errno));
    return exit_failure;
  }
  std::unique_ptr<shm::ArenaOwner> arena;
  std::unique_ptr<shm::StateSegment> state;
  bool adopted = false;
  std::string fresh_reason;
  if (!open_host_tier(options, arena, state, adopted, fresh_reason)) return exit_failure;
  shm::guard_arena(arena->data(), arena->data_bytes());
  std::unique_ptr<daemon::EntryState> entry_state;
  if (state) entry_state = std::make_unique<daemon::EntryState>(*state);

  // The disk tier is optional: without it (or if it cannot start) the host tier serves.
  disk::RecoveryReport recovery;
  std::string disk_failure;
  std::unique_ptr<daemon::DiskTier> disk = open_disk_tier(options, *arena, recovery, disk_failure);

  std::unique_ptr<daemon::RemoteTier> remote = open_remote_tier(options);

  daemon::EntryTable table(arena->data_bytes(), limits::extent_align_bytes);
  table.set_state(entry_state.get());
  // Clients check the arena's identity at HELLO: it outlives daemon incarnations.
  daemon::Park park({.arena_data = arena->data(),
                     .arena_data_bytes = arena->data_bytes(),
                     .arena_pages = static_cast<uint32_t>(arena->pages()),
                     .arena_page_bytes = arena->page_bytes(),
                     .incarnation = arena->header().incarnation,
                     .reservation_bytes_max = options.reservation_bytes_max,
                     .connections_max = limits::connections_max,
                     .disk = disk.get(),
                     .remote = remote.get(),
                     .state = entry_state.get()},
                    table);
  daemon::AdoptionReport adoption;
  if (adopted) {
    adoption = daemon::adopt_entries(*entry_state, arena->data(), arena->data_bytes(), table);
    log_info("kvparkd: %s", adoption.summary().c_str());
    park.hold_adopted(adoption.previous_pids, monotonic_usec() + limits::adopted_lease_grace_usec);
  }
  if (disk) recover_disk(park, *disk, recovery);
  park.set_low_water_bytes(options.arena_low_water_bytes);  // derived by finish_options
  gid_t attach_gid = static_cast<gid_t>(-1);
  if (const group* g = getgrnam(options.attach_group.c_str()); g != nullptr) {
    attach_gid = g->gr_gid;
  }
  daemon::Server server({.socket_path = options.socket_path,
                         .lock_fd = claim.lock_fd,
                         .arena_header_fd = arena->header_fd(),
                         .arena_data_fd = arena->data_fd(),
                         .attach_gid = attach_gid},
                        park);
  if (Status s = server.listen(err); s != Status::Ok) {
    log_error("kvparkd: cannot listen on %s: %s", options.socket_path.c_str(), strerror(err));
    return exit_failure;
  }
  daemon::LoopQueue loop;
  daemon::ControlPlane control({.version = kvpark::version,
                                .socket_path = options.socket_path,
                                .incarnation = incarnation,
                                .start_usec = monotonic_usec(),
                                .arena_pages = shm::arena_pages_name(arena->pages()),
                                .arena_page_bytes = arena->page_bytes(),
                                .reload =
                                    [&options, &park](std::string& ret_message) {
                                      return daemon::reload_options(options, park, ret_message);
                                    },
                                .limit_changed =
                                    [&options](const daemon::LimitChange& change) {
                                      daemon::keep_limit_change(options, change);
                                    },
                                .disk_failure = disk_failure,
                                .adoption = adoption,
                                .fresh_start_reason = fresh_reason},
                               park, table, loop);
  // Operations: SIGHUP reload, HTTP status and metrics, the systemd notify protocol.
  daemon::Notifier notifier(options.watchdog_usec);
  const int reload_fd = open_reload_signal_fd();
  if (reload_fd < 0) {
    log_error("kvparkd: cannot open a signalfd for SIGHUP: %s", strerror(errno));
    return exit_failure;
  }
  auto reload = [&] {
    signalfd_siginfo info{};
    while (read(reload_fd, &info, sizeof info) == sizeof info) {
    }
    notifier.reloading();
    std::string message;
    daemon::reload_options(options, park, message);
    log_notice("kvparkd: %s", message.c_str());
    notifier.reloaded(message);
  };
  if (!server.watch(loop.event_fd(), [&loop] { loop.drain(); }) ||
      (disk && !server.watch(disk->store().notify_fd(), [&park] { park.on_disk_completions(); })) ||
      (remote && !server.watch(remote->notify_fd(), [&park] { park.on_remote_completions(); })) ||
      !server.watch(reload_fd, reload)) {
    log_error("kvparkd: cannot watch the loop's descriptors: %s", strerror(errno));
    return exit_failure;
  }
  daemon::HttpAdapter http(control);
  const std::string http_bound = start_http(http, options.http_listen);
  std::unique_ptr<daemon::DbusAdapter> dbus;
  if (options.dbus_bus != daemon::DbusBus::Off) {
    std::string dbus_error;
    dbus = daemon::DbusAdapter::start(
        {.bus = options.dbus_bus, .admin_group = options.admin_group}, control, dbus_error);
    if (!dbus) log_warning("kvparkd: no D-Bus control: %s", dbus_error.c_str());
  }
  log_info("kvparkd %s started: listening on %s%s%s, arena %s of %llu MiB on %s pages, "
           "incarnation %016llx",
           kvpark::version, options.socket_path.c_str(), http_bound.empty() ? "" : ", http on ",
           http_bound.c_str(), options.arena_name.c_str(),
           static_cast<unsigned long long>(arena->data_bytes() >> 20), shm::arena_pages_name(arena->pages()),
           static_cast<unsigned long long>(incarnation));
  notifier.ready("serving on " + options.socket_path +
                 (http_bound.empty() ? "" : ", http on " + http_bound));
  control.set_serving(true);
  Ticker ticker{.park = park, .control = control, .notifier = notifier};
  if (server.run(daemon::watchdog_tick_msec(options.watchdog_usec, tick_msec), Ticker::run,
                 &ticker) != Status::Ok) {
    log_error("kvparkd: event loop failed: %s", strerror(errno));
    return exit_failure;
  }
  control.set_serving(false);
  notifier.stopping("stopping");
  // Engines may still copy out of their leases: the next instance waits for them.
  if (entry_state) entry_state->freeze_connections();
  server.close_connections();
  if (disk && options.spill_on_shutdown) spill_before_stopping(park, *disk, notifier);
  if (disk && !disk->save_budget(monotonic_usec(), true)) {
    log_error("kvparkd: cannot save the day's disk writes to %s: %s", disk->budget_path().c_str(),
              strerror(errno));
  }
  loop.close();  // adapter threads waiting on the loop get 'unavailable' from here on
  http.stop();
  dbus.reset();
  log_info("kvparkd: stopped");
  return 0;
}
