// kvparkd: wires the arena, the entry table, the core, the socket server and the
// operator's adapters together; each start and stop step is in startup.h.
#include <cerrno>
#include <cstring>

#include "daemon/clock.h"
#include "daemon/command_line.h"
#include "daemon/config.h"
#include "daemon/control_plane.h"
#include "daemon/dbus_adapter.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/http_adapter.h"
#include "daemon/log.h"
#include "daemon/loop_queue.h"
#include "daemon/notify.h"
#include "daemon/park.h"
#include "daemon/restart.h"
#include "daemon/server.h"
#include "daemon/startup.h"
#include "proto/limits.h"
#include "proto/names.h"
#include "proto/version.h"
#include "shm/arena.h"
#include "shm/arena_guard.h"
#include "shm/state_segment.h"

using namespace kvpark;
using daemon::exit_failure;
using daemon::monotonic_usec;

namespace {

constexpr int tick_msec = 50;  // WAIT deadlines are honoured to this resolution

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

}  // namespace

int main(int argc, char** argv) {
  daemon::DaemonOptions options;
  int exit_code = 0;
  if (!daemon::parse_options(argc, argv, options, exit_code)) return exit_code;
  daemon::log_overrides(options);
  if (!daemon::block_signals()) {
    log_error("kvparkd: cannot set up signal handling: %s", strerror(errno));
    return exit_failure;
  }

  // First, before the arena name or the disk directory is touched: they may be
  // another live daemon's.
  daemon::SocketClaim claim;
  if (const int code = daemon::claim_socket(options, claim); code != 0) return code;
  daemon::PidLock disk_claim;  // held until exit
  if (const int code = daemon::claim_disk_directory(options, disk_claim); code != 0) return code;

  uint64_t incarnation = 0;
  if (!daemon::random_incarnation(incarnation)) {
    log_error("kvparkd: no random incarnation from getrandom: %s", strerror(errno));
    return exit_failure;
  }
  std::unique_ptr<shm::ArenaOwner> arena;
  std::unique_ptr<shm::StateSegment> state;
  bool adopted = false;
  std::string fresh_reason;
  std::unique_ptr<daemon::KeptMemory> index_memory;
  if (!daemon::open_host_tier(options, arena, state, index_memory, adopted, fresh_reason)) {
    return exit_failure;
  }
  // Before the entry table: its bulk comes from the kept memory, which outlives it.
  daemon::use_kept_memory(index_memory.get());
  shm::guard_arena(arena->data(), arena->data_bytes());
  std::unique_ptr<daemon::EntryState> entry_state;
  if (state) entry_state = std::make_unique<daemon::EntryState>(*state);

  // The disk tier is optional: without it (or if it cannot start) the host tier serves.
  disk::RecoveryReport recovery;
  std::string disk_failure;
  std::unique_ptr<daemon::DiskTier> disk =
      daemon::open_disk_tier(options, *arena, recovery, disk_failure);

  std::unique_ptr<daemon::RemoteTier> remote = daemon::open_remote_tier(options);

  daemon::EntryTable table(arena->data_bytes(), limits::extent_align_bytes);
  table.set_state(entry_state.get());
  // Clients check the arena's identity at HELLO: it outlives daemon incarnations.
  daemon::Park park({.arena_data = arena->data(),
                     .arena_data_bytes = arena->data_bytes(),
                     .arena_pages = static_cast<uint32_t>(arena->pages()),
                     .arena_page_bytes = arena->page_bytes(),
                     .incarnation = arena->header().incarnation,
                     .reservation_bytes_max = options.reservation_bytes_max,
                     .unsealed_connection_bytes_max = options.unsealed_connection_bytes_max,
                     .unsealed_uid_bytes_max = options.unsealed_uid_bytes_max,
                     .connections_max = limits::connections_max,
                     .disk = disk.get(),
                     .remote = remote.get(),
                     .state = entry_state.get()},
                    table);
  const daemon::AdoptionReport adoption = daemon::take_over_index(
      adopted, index_memory.get(), entry_state.get(), *arena, table, park);
  if (disk) daemon::recover_disk(park, *disk, recovery);
  daemon::release_unused_index_memory(index_memory.get());
  park.set_low_water_bytes(options.arena_low_water_bytes);  // derived by finish_options
  daemon::Server server({.socket_path = options.socket_path,
                         .lock_fd = claim.lock_fd,
                         .arena_header_fd = arena->header_fd(),
                         .arena_data_fd = arena->data_fd(),
                         .attach_gid = daemon::attach_group_id(options.attach_group)},
                        park);
  int err = 0;
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
  const int reload_fd = daemon::open_reload_signal_fd();
  if (reload_fd < 0) {
    log_error("kvparkd: cannot open a signalfd for SIGHUP: %s", strerror(errno));
    return exit_failure;
  }
  auto reload = [&] { daemon::reload_on_signal(reload_fd, options, park, notifier); };
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
           "incarnation %s",
           kvpark::version, options.socket_path.c_str(), http_bound.empty() ? "" : ", http on ",
           http_bound.c_str(), options.arena_name.c_str(),
           static_cast<unsigned long long>(arena->data_bytes() >> 20), shm::arena_pages_name(arena->pages()),
           hex64(incarnation).c_str());
  // Serving before READY=1: whoever READY=1 wakes (systemd's ordering, a health
  // probe) must find /health ready, not starting.
  control.set_serving(true);
  notifier.ready("serving on " + options.socket_path +
                 (http_bound.empty() ? "" : ", http on " + http_bound));
  daemon::LoopTicker ticker{.park = park, .control = control, .notifier = notifier};
  if (server.run(daemon::watchdog_tick_msec(options.watchdog_usec, tick_msec), daemon::LoopTicker::run,
                 &ticker) != Status::Ok) {
    log_error("kvparkd: event loop failed: %s", strerror(errno));
    return exit_failure;
  }
  control.set_serving(false);
  notifier.stopping("stopping");
  daemon::stop_core(options, server, park, entry_state.get(), notifier);
  loop.close();  // adapter threads waiting on the loop get 'unavailable' from here on
  http.stop();
  dbus.reset();
  // The entry table's arrays stay for the next instance: as an index it adopts when
  // this stop was clean, or as pages it rebuilds the index in.
  daemon::leave_index(table, entry_state.get(), index_memory.get());
  log_info("kvparkd: stopped");
  return 0;
}
