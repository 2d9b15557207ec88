// kvparkd: wires the arena, the entry table, the core and the socket server.
#include <grp.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "daemon/control_plane.h"
#include "daemon/entry_table.h"
#include "daemon/loop_queue.h"
#include "daemon/log.h"
#include "daemon/options.h"
#include "daemon/park.h"
#include "daemon/server.h"
#include "proto/limits.h"
#include "shm/arena.h"

using namespace kvpark;

namespace {

constexpr int tick_msec = 1000;
constexpr const char* version = "0.1.0";

uint64_t monotonic_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

uint64_t random_incarnation() {
  uint64_t value = 0;
  while (getrandom(&value, sizeof value, 0) != sizeof value || value == 0) {
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  daemon::DaemonOptions options;
  int exit_code = 0;
  if (!daemon::parse_options(argc, argv, options, exit_code)) return exit_code;

  // Signals arrive through the server's signalfd.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const uint64_t incarnation = random_incarnation();
  std::unique_ptr<shm::ArenaOwner> arena;
  int err = 0;
  shm::ArenaOptions arena_options{.name = options.arena_name,
                                  .data_bytes = options.arena_bytes,
                                  .incarnation = incarnation};
  if (Status s = shm::ArenaOwner::create(arena_options, arena, err); s != Status::Ok) {
    log_error("kvparkd: cannot create a %llu-byte arena '%s': %s (%s)",
              static_cast<unsigned long long>(options.arena_bytes), options.arena_name.c_str(),
              std::string(status_name(s)).c_str(), strerror(err));
    return 1;
  }

  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(options.socket_path).parent_path(),
                                      ec);

  daemon::EntryTable table(arena->data_bytes(), limits::extent_align_bytes);
  daemon::Park park({.arena_data = arena->data(),
                     .arena_bytes = arena->arena_bytes(),
                     .incarnation = incarnation,
                     .reservation_bytes_max = options.reservation_bytes_max,
                     .connections_max = limits::connections_max},
                    table);
  gid_t attach_gid = static_cast<gid_t>(-1);
  if (const group* g = getgrnam(options.attach_group.c_str()); g != nullptr) {
    attach_gid = g->gr_gid;
  }
  daemon::Server server({.socket_path = options.socket_path,
                         .arena_fd = arena->fd(),
                         .attach_gid = attach_gid},
                        park);
  if (Status s = server.listen(err); s != Status::Ok) {
    log_error("kvparkd: cannot listen on %s: %s", options.socket_path.c_str(), strerror(err));
    return 1;
  }
  daemon::LoopQueue loop;
  server.watch(loop.event_fd(), [&loop] { loop.drain(); });
  daemon::ControlPlane control({.version = version,
                                .socket_path = options.socket_path,
                                .incarnation = incarnation,
                                .start_usec = monotonic_usec()},
                               park, table, loop);
  log_info("kvparkd: ready on %s, arena %s of %llu MiB, incarnation %016llx",
           options.socket_path.c_str(), options.arena_name.c_str(),
           static_cast<unsigned long long>(arena->data_bytes() >> 20),
           static_cast<unsigned long long>(incarnation));
  auto on_tick = [](void* context) { static_cast<daemon::Park*>(context)->tick(); };
  if (server.run(tick_msec, on_tick, &park) != Status::Ok) {
    log_error("kvparkd: event loop failed: %s", strerror(errno));
    return 1;
  }
  loop.close();  // adapter threads waiting on the loop get 'unavailable' from here on
  log_info("kvparkd: stopped cleanly");
  return 0;
}
