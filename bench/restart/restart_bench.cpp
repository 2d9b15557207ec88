// kvpark-restart-bench: what a daemon restart costs the host tier, before and after
// the arena is kept in systemd's fd store, measured in one run on one machine.
//
// The bench plays the service manager (tests/testing/fd_store.h: NOTIFY_SOCKET,
// FDSTORE=1, LISTEN_FDS) for a kvparkd it starts, parks a set of 256 KiB blocks
// filling 60% of the arena, and for each way of stopping (SIGTERM, SIGKILL), with the
// fd store off (today's behaviour without a service manager) and on, measures:
//   restart   signal -> the first LOOKUP answered (by a client connected across it)
//   restored  what fraction of the parked blocks that lookup found
//   restore   the first restore after the restart (every block copied out, verified)
//             in GB/s, next to the same client's second one, its third after a TLB
//             flush of its own (flush_own_tlb()), a fresh client's, and memcpy of the
//             same bytes
//
//   kvpark-restart-bench [--quick] [--kvparkd PATH] [--arena-mib N] [--block-kib N]
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "tests/testing/fd_store.h"

extern char** environ;

namespace {

using kvpark::testing::ManagerFdStore;

constexpr uint32_t block_tokens = 64;
uint64_t block_bytes = 256 * 1024;  // --block-kib
constexpr size_t publish_batch_blocks = 64;
constexpr int ready_timeout_msec = 120'000;
constexpr kvpark_hash128 bench_ns{0x7e57a7, 0x7e57a7};

double now_sec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Manager {
  std::string directory, notify_path, socket_path, kvparkd;
  uint64_t arena_bytes = 0;
  int notify_fd = -1;
  ManagerFdStore store;
  bool keep = false;  // play the fd store (else fds sent are closed)
  pid_t pid = -1;

  void drain() {
    std::string message;
    std::vector<int> fds;
    while (kvpark::testing::receive_notify(notify_fd, message, fds)) {
      if (keep) {
        store.handle(message, fds);
      } else {
        for (int fd : fds) close(fd);
      }
    }
  }
  bool start() {
    drain();
    std::vector<std::string> argv = {
        kvparkd,         "--socket",    socket_path, "--arena-size", std::to_string(arena_bytes),
        "--http-listen", "off",         "--dbus",    "off",          "--disk-dir",
        "off",           "--state-dir", "off"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back("NOTIFY_SOCKET=" + notify_path);
    const std::string log = directory + "/kvparkd.log";
    const int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    pid = kvpark::testing::spawn_with_fds(argv, env, log_fd, store);
    close(log_fd);
    if (pid <= 0) return false;
    const double deadline = now_sec() + ready_timeout_msec / 1000.0;
    for (;;) {
      pollfd p{notify_fd, POLLIN, 0};
      const int left = static_cast<int>((deadline - now_sec()) * 1000);
      if (left <= 0 || poll(&p, 1, left) <= 0) return false;
      std::string message;
      std::vector<int> fds;
      while (kvpark::testing::receive_notify(notify_fd, message, fds)) {
        const bool ready = ("\n" + message + "\n").find("\nREADY=1\n") != std::string::npos;
        if (keep) {
          store.handle(message, fds);
        } else {
          for (int fd : fds) close(fd);
        }
        if (ready) return true;
      }
    }
  }
  void stop(int signal_number) {
    if (pid <= 0) return;
    kill(pid, signal_number);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    drain();
  }
};

std::vector<int32_t> prompt_tokens(size_t blocks) {
  std::vector<int32_t> t(blocks * block_tokens + 1);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>((i * 2654435761u) % 50000);
  return t;
}

kvpark_client* connect(const std::string& socket) {
  kvpark_namespace ns{};
  ns.id = bench_ns;
  ns.block_tokens = block_tokens;
  ns.block_payload_bytes = block_bytes;
  ns.client_name = "kvpark-restart-bench";
  kvpark_client* c = nullptr;
  return kvpark_connect(socket.c_str(), &ns, &c) == KVPARK_OK ? c : nullptr;
}

bool publish(kvpark_client* c, const std::vector<int32_t>& tokens, size_t blocks) {
  kvpark_publish_options options{1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  std::vector<uint8_t> payload(block_bytes);
  for (size_t first = 0; first < blocks; first += publish_batch_blocks) {
    const size_t count = std::min(publish_batch_blocks, blocks - first);
    kvpark_reservation* r = nullptr;
    if (kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), first, count, &r) !=
        KVPARK_OK)
      return false;
    for (size_t i = 0; i < count; ++i) {
      std::memset(payload.data(), static_cast<int>((first + i) & 0xff), payload.size());
      if (kvpark_reservation_block(r, i) != nullptr)
        kvpark_reservation_write_block(r, i, payload.data());
    }
    if (kvpark_seal(r) != KVPARK_OK) return false;
  }
  return true;
}

// Looks the prompt up; restored blocks in ret_blocks; copies them all out when asked
// (seconds in ret_copy_sec, 0 if a copy failed verification).
bool lookup(kvpark_client* c, const std::vector<int32_t>& tokens, bool copy, size_t& ret_blocks,
            double& ret_copy_sec, std::vector<uint8_t>& buffer) {
  kvpark_plan* plan = nullptr;
  if (kvpark_lookup(c, 1, tokens.data(), tokens.size(), &plan) != KVPARK_OK) return false;
  ret_blocks = kvpark_plan_block_count(plan);
  ret_copy_sec = 0;
  if (copy) {
    const double t0 = now_sec();
    bool good = true;
    for (size_t i = 0; i < ret_blocks && good; ++i) {
      good = kvpark_plan_copy_block(plan, i, buffer.data() + i * block_bytes) == KVPARK_OK;
    }
    ret_copy_sec = good ? now_sec() - t0 : 0;
  }
  kvpark_plan_release(plan);
  return true;
}

// Unmaps a MiB of the client's own memory: past the kernel's ceiling for flushing page by
// page (33 pages on x86), that flushes the whole TLB of its address space, as any engine
// does now and then. On 4 KiB arena pages the next pass pays for refilling it, which
// some hypervisors (shadow page tables) charge for by the page: the reference that tells
// that cost from the restart's, in the same run.
void flush_own_tlb() {
  constexpr size_t bytes = 1 << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  std::memset(p, 1, bytes);
  munmap(p, bytes);
}

struct Row {
  const char* store;
  const char* stop;
  double restart_ms = 0;
  double restored_share = 0;
  double restore_gbps = 0;  // the client connected across the restart
  double warm_gbps = 0;     // the same client's second restore
  double flushed_gbps = 0;  // its third, after flush_own_tlb()
  double fresh_gbps = 0;    // a client that connects after it (maps anew)
  double memcpy_gbps = 0;   // the best of three, between the restores
};

}  // namespace

int main(int argc, char** argv) {
  uint64_t arena_mib = 1024;
  std::string kvparkd = std::getenv("KVPARKD") != nullptr ? std::getenv("KVPARKD") : "";
  static const option options[] = {{"quick", no_argument, nullptr, 'q'},
                                   {"kvparkd", required_argument, nullptr, 'k'},
                                   {"arena-mib", required_argument, nullptr, 'a'},
                                   {"block-kib", required_argument, nullptr, 'b'},
                                   {"help", no_argument, nullptr, 'h'},
                                   {nullptr, 0, nullptr, 0}};
  for (int o; (o = getopt_long(argc, argv, "", options, nullptr)) != -1;) {
    if (o == 'q')
      arena_mib = 64;
    else if (o == 'k')
      kvparkd = optarg;
    else if (o == 'a')
      arena_mib = std::strtoull(optarg, nullptr, 0);
    else if (o == 'b')
      block_bytes = std::strtoull(optarg, nullptr, 0) << 10;
    else {
      std::printf(
          "Usage: kvpark-restart-bench [--quick] [--kvparkd PATH] [--arena-mib N] [--block-kib "
          "N]\n");
      return o == 'h' ? 0 : 2;
    }
  }
  if (kvparkd.empty()) kvparkd = KVPARK_BENCH_KVPARKD;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  char templ[] = "/tmp/kvpark-restart-bench-XXXXXX";
  Manager m;
  m.directory = mkdtemp(templ);
  m.notify_path = m.directory + "/notify";
  m.socket_path = m.directory + "/kvparkd.sock";
  m.kvparkd = kvparkd;
  m.arena_bytes = arena_mib << 20;
  m.notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, m.notify_path.c_str(), sizeof addr.sun_path - 1);
  if (bind(m.notify_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 1;

  const size_t blocks = std::min<size_t>(m.arena_bytes * 6 / 10 / (block_bytes + 4096), 8192);
  const std::vector<int32_t> tokens = prompt_tokens(blocks);
  std::vector<uint8_t> buffer(blocks * block_bytes), source(blocks * block_bytes, 1);
  std::vector<Row> rows;
  for (bool keep : {false, true}) {
    for (int signal_number : {SIGTERM, SIGKILL}) {
      m.keep = keep;
      m.store.clear();
      if (!m.start()) return std::fprintf(stderr, "kvparkd did not start\n"), 1;
      kvpark_client* c = connect(m.socket_path);
      if (c == nullptr || !publish(c, tokens, blocks))
        return std::fprintf(stderr, "publish failed\n"), 1;
      size_t found = 0;
      double sec = 0;
      (void)lookup(c, tokens, true, found, sec, buffer);  // the client's pages are mapped now

      Row row{keep ? "kept (fd store)" : "none (today)",
              signal_number == SIGTERM ? "SIGTERM" : "SIGKILL"};
      const double t0 = now_sec();
      m.stop(signal_number);
      if (!m.start()) return std::fprintf(stderr, "kvparkd did not restart\n"), 1;
      if (!lookup(c, tokens, false, found, sec, buffer))
        return std::fprintf(stderr, "lookup failed\n"), 1;
      row.restart_ms = (now_sec() - t0) * 1e3;
      row.restored_share = static_cast<double>(found) / static_cast<double>(blocks);
      // The bench forked the daemon, so its own pages are copy-on-write until written
      // again (an engine is not the daemon's parent): the memcpy reference rewrites
      // the destination first, and the restores measure the arena side alone.
      for (int i = 0; i < 3; ++i) {
        const double m0 = now_sec();
        std::memcpy(buffer.data(), source.data(), buffer.size());
        row.memcpy_gbps =
            std::max(row.memcpy_gbps, static_cast<double>(buffer.size()) / (now_sec() - m0) / 1e9);
      }
      if (found > 0 && lookup(c, tokens, true, found, sec, buffer) && sec > 0) {
        row.restore_gbps = static_cast<double>(found * block_bytes) / sec / 1e9;
      }
      if (found > 0 && lookup(c, tokens, true, found, sec, buffer) && sec > 0) {
        row.warm_gbps = static_cast<double>(found * block_bytes) / sec / 1e9;
      }
      flush_own_tlb();
      if (found > 0 && lookup(c, tokens, true, found, sec, buffer) && sec > 0) {
        row.flushed_gbps = static_cast<double>(found * block_bytes) / sec / 1e9;
      }
      if (kvpark_client* fresh = connect(m.socket_path); fresh != nullptr) {
        if (lookup(fresh, tokens, true, found, sec, buffer) && found > 0 && sec > 0) {
          row.fresh_gbps = static_cast<double>(found * block_bytes) / sec / 1e9;
        }
        kvpark_disconnect(fresh);
      }
      rows.push_back(row);
      kvpark_disconnect(c);
      m.stop(SIGKILL);
    }
  }
  std::printf("kvpark-restart-bench: %llu MiB arena, %zu blocks of %llu KiB parked (%.0f MiB)\n",
              static_cast<unsigned long long>(arena_mib), blocks,
              static_cast<unsigned long long>(block_bytes >> 10),
              static_cast<double>(blocks * block_bytes) / (1 << 20));
  std::printf("%-17s %-8s %11s %9s %13s %10s %13s %11s %12s\n", "arena store", "stop", "restart ms",
              "restored", "first GB/s", "warm GB/s", "flushed GB/s", "fresh GB/s", "memcpy GB/s");
  for (const Row& r : rows) {
    std::printf("%-17s %-8s %11.1f %8.0f%% %13.2f %10.2f %13.2f %11.2f %12.2f\n", r.store, r.stop,
                r.restart_ms, r.restored_share * 100, r.restore_gbps, r.warm_gbps, r.flushed_gbps,
                r.fresh_gbps, r.memcpy_gbps);
  }
  std::printf(
      "restart: signal -> the first LOOKUP answered (a client connected across it); first: that "
      "client's first restore after the restart, warm: its second, flushed: its third, after a "
      "TLB flush of its own (no restart), fresh: a client that connects afterwards (maps anew); "
      "every restore verified\n");
  // The daemon's own account of its adoptions.
  FILE* log = std::fopen((m.directory + "/kvparkd.log").c_str(), "r");
  for (char line[512]; log != nullptr && std::fgets(line, sizeof line, log) != nullptr;) {
    if (std::strstr(line, "from the previous instance") != nullptr) std::printf("  %s", line);
  }
  if (log != nullptr) std::fclose(log);
  std::error_code ec;
  std::filesystem::remove_all(m.directory, ec);
  return 0;
}
