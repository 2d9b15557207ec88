// kvpark-bench: host-tier figures of issue 2 in one run, against its own kvparkd.
//
//   kvpark-bench [--quick] [--json] [--kvparkd PATH]
//
// Sections: 1 LOOKUP latency, 2 restore/publish throughput vs memcpy, 3 hashing
// cost, 4 daemon memory per indexed block. Sections 1, 2 and 4 each start a fresh
// kvparkd (own socket directory and arena name) sized for that section, so one
// section's state cannot disturb another's figures. Exit status: 0 when every
// section ran (a target MISS is a figure, not a failure), 1 when one failed, 2 on
// a bad flag.
#include <getopt.h>
#include <unistd.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "client/copy_xxh3.h"
#include "proto/version.h"
#include "shm/arena_format.h"
#include "tests/testing/daemon_process.h"

using namespace kvpark::bench;

namespace {

struct Options {
  bool quick = false;
  bool json = false;
  std::string kvparkd;
};

struct Sizes {
  int lookup_iterations;
  int lookup_warmup;
  uint64_t copy_bytes;
  int copy_repetitions;
  int hash_repetitions;
  size_t memory_blocks;
  uint64_t attach_arena_bytes;
};
constexpr Sizes full_sizes = {2000, 200, 1ull << 30, 9, 300, 100'000, 8ull << 30};
constexpr Sizes quick_sizes = {200, 20, 64ull << 20, 2, 20, 10'000, 64ull << 20};
// Restoring through the verifying copy may cost this much of memcpy (issue 12).
constexpr double verified_restore_ratio_min = 0.85;
constexpr double attach_msec_max = 5;

struct Report {
  std::vector<LookupResult> lookups;
  Percentiles socket_floor;
  std::vector<CopyResult> copies;  // one per --huge-pages setting
  CopyResult copy;                 // the last of them, for --json
  AttachResult attach;
  std::vector<HashResult> hashes;
  MemoryResult memory;
  int passed = 0;
  int missed = 0;
};

const char* verdict(Report& report, bool pass) {
  (pass ? report.passed : report.missed)++;
  return pass ? "PASS" : "MISS";
}

void usage(FILE* out) {
  fprintf(out,
          "Usage: kvpark-bench [--quick] [--json] [--kvparkd PATH]\n"
          "Measures kvpark's host tier against a kvparkd it starts itself.\n\n"
          "  --quick         small sizes (a smoke test, seconds)\n"
          "  --json          machine-readable output on stdout\n"
          "  --kvparkd PATH  daemon to start (default: $KVPARKD, then beside this binary)\n"
          "  -h, --help      this help\n"
          "      --version   the version\n");
}

bool parse(int argc, char** argv, Options& o, int& ret_exit) {
  enum { opt_kvparkd = 1, opt_version };
  static const option long_options[] = {{"quick", no_argument, nullptr, 'q'},
                                        {"json", no_argument, nullptr, 'j'},
                                        {"kvparkd", required_argument, nullptr, opt_kvparkd},
                                        {"help", no_argument, nullptr, 'h'},
                                        {"version", no_argument, nullptr, opt_version},
                                        {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options, nullptr)) != -1) {
    switch (c) {
      case 'q': o.quick = true; break;
      case 'j': o.json = true; break;
      case opt_kvparkd: o.kvparkd = optarg; break;
      case 'h': usage(stdout); ret_exit = 0; return false;
      case opt_version: printf("kvpark-bench %s\n", kvpark::version); ret_exit = 0; return false;
      default: usage(stderr); ret_exit = 2; return false;
    }
  }
  if (optind != argc) {
    usage(stderr);
    ret_exit = 2;
    return false;
  }
  return true;
}

double gib_per_sec(uint64_t bytes, double sec) { return sec > 0 ? double(bytes) / sec / (1ull << 30) : 0; }

void print_table(const Options& o, const Sizes& z, Report& r, const std::string& kvparkd) {
  printf("kvpark-bench (%s run) — kvparkd %s — %ld CPUs online\n\n", o.quick ? "quick" : "full",
         kvparkd.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  printf("1. LOOKUP round trip: %zu parked tokens + a 37-token new turn, every block restorable\n"
         "   target: p50 <= %.0f µs and p99 <= %.0f µs (judged on the full call)\n",
         prompt_tokens, lookup_p50_usec_max, lookup_p99_usec_max);
  printf("   %5s %7s  %-34s %8s %8s %8s %8s  %s\n", "block", "clients", "measure", "p50 µs",
         "p99 µs", "max µs", "samples", "result");
  for (const LookupResult& l : r.lookups) {
    const bool pass = l.full.p50_usec <= lookup_p50_usec_max && l.full.p99_usec <= lookup_p99_usec_max;
    printf("   %5u %7d  %-34s %8.1f %8.1f %8.1f %8zu  %s\n", l.block_tokens, l.clients,
           "lookup+release (hash, confirm)", l.full.p50_usec, l.full.p99_usec, l.full.max_usec,
           l.full.samples, verdict(r, pass));
    printf("   %5s %7s  %-34s %8.1f %8.1f %8.1f %8zu  %s\n", "", "", "  socket only (pre-hashed)",
           l.socket.p50_usec, l.socket.p99_usec, l.socket.max_usec, l.socket.samples, "-");
  }
  printf("   %5s %7s  %-34s %8.1f %8.1f %8.1f %8zu  %s\n", "-", "1",
         "reference: bare SEQPACKET ping-pong", r.socket_floor.p50_usec, r.socket_floor.p99_usec,
         r.socket_floor.max_usec, r.socket_floor.samples, "-");
  printf("   (full: one round trip plus a one-way RELEASE; socket only: LOOKUP and a replied\n"
         "    RELEASE, two round trips; the reference row is the kernel's floor for one)\n");
  const CopyResult& c0 = r.copies.front();
  printf(
      "\n2. Copy of a %.0f MiB entry between the arena and private memory, vs memcpy\n"
      "   medians of %d repetitions, a memcpy run before each pass; each\n"
      "   interval covers the verbs too (reserve+copy+checksum+seal, lookup+copy+verify+\n"
      "   release). Targets: publish >= %.2f; restore (verified) warm >= %.2f; first touch\n"
      "   >= %.2f on huge pages (4 KiB first-touch rows: no target). Copy kernel: %s\n",
      double(c0.bytes) / (1 << 20), c0.repetitions, copy_ratio_min, verified_restore_ratio_min,
      copy_ratio_min, kvpark::client::copy_kernel_name(kvpark::client::best_copy_kernel()));
  printf("   %-10s %-8s %-50s %7s %6s  %s\n", "huge_pages", "pages", "measure", "GiB/s", "ratio", "result");
  for (const CopyResult& c : r.copies) {
    const bool huge = c.pages != "4k";
    printf("   %-10s %-8s %-50s %7.2f %6.2f  %s\n", c.huge_pages.c_str(), c.pages.c_str(),
           "memcpy, private -> private (both faulted in)", gib_per_sec(c.bytes, c.memcpy_sec), 1.0, "-");
    struct Line { const char* name; double sec; double target; };
    const Line lines[] = {
        {"publish, first touch (fresh mapping, page faults)", c.publish_first_sec,
         huge ? copy_ratio_min : 0},
        {"publish, warm (same mapping and extent)", c.publish_warm_sec, copy_ratio_min},
        {"restore verified, first touch (fresh mapping)", c.restore_first_sec,
         huge ? copy_ratio_min : 0},
        {"restore verified, warm (same mapping)", c.restore_warm_sec,
         verified_restore_ratio_min}};
    for (const Line& line : lines) {
      const double x = line.sec > 0 ? c.memcpy_sec / line.sec : 0;
      printf("   %-10s %-8s %-50s %7.2f %6.2f  %s\n", c.huge_pages.c_str(), c.pages.c_str(), line.name,
             gib_per_sec(c.bytes, line.sec), x, line.target > 0 ? verdict(r, x >= line.target) : "-");
    }
    printf("   %-10s %-8s loop response to another client: idle p50 %.1f / max %.1f µs; during the\n"
           "   %-10s %-8s publishes p50 %.1f / p99 %.1f / max %.1f µs (%zu samples)\n",
           c.huge_pages.c_str(), c.pages.c_str(), c.loop_idle.p50_usec, c.loop_idle.max_usec, "", "",
           c.loop_during_publish.p50_usec, c.loop_during_publish.p99_usec, c.loop_during_publish.max_usec,
           c.loop_during_publish.samples);
    if (!c.warm_reused_extent) printf("   note: a warm publish landed on a different extent\n");
  }
  const AttachResult& at = r.attach;
  printf("\n5. Attach to a %.0f MiB arena: kvpark_connect %.2f ms median (target <= %.0f ms) %s; "
         "page tables grew %lld KiB\n",
         double(at.arena_bytes) / (1 << 20), at.connect_msec, attach_msec_max,
         verdict(r, at.connect_msec <= attach_msec_max), static_cast<long long>(at.page_table_kib));
  printf("\n3. Chain hashing (kvpark_chain_hashes, XXH3-128) of the %zu-token prompt\n"
         "   target: <= %.0f ns per token\n",
         prompt_tokens, hash_nsec_per_token_max);
  printf("   %-12s %12s  %s\n", "chunk tokens", "ns/token", "result");
  for (const HashResult& h : r.hashes) {
    printf("   %12u %12.3f  %s\n", h.chunk_tokens, h.nsec_per_token,
           verdict(r, h.nsec_per_token <= hash_nsec_per_token_max));
  }
  const MemoryResult& m = r.memory;
  printf("\n4. Daemon private memory per indexed block (%u-token blocks, %llu-byte payload)\n",
         memory_block_tokens, static_cast<unsigned long long>(memory_block_payload_bytes));
  printf("   %zu blocks: RssAnon %llu KiB -> %llu KiB = %.0f bytes per block (no target)\n",
         m.blocks, static_cast<unsigned long long>(m.rss_anon_before_kib),
         static_cast<unsigned long long>(m.rss_anon_after_kib), m.bytes_per_block);
  printf("\ntargets: %d PASS, %d MISS\n", r.passed, r.missed);
  (void)z;
}

void print_percentiles(const char* name, const Percentiles& p, bool last) {
  printf("\"%s\": {\"p50_usec\": %.2f, \"p99_usec\": %.2f, \"max_usec\": %.2f, \"samples\": %zu}%s",
         name, p.p50_usec, p.p99_usec, p.max_usec, p.samples, last ? "" : ", ");
}

void print_json(const Options& o, Report& r, const std::string& kvparkd) {
  printf("{\"mode\": \"%s\", \"kvparkd\": \"%s\", \"cpus\": %ld,\n", o.quick ? "quick" : "full",
         kvparkd.c_str(), sysconf(_SC_NPROCESSORS_ONLN));
  printf(" \"lookup\": {\"prompt_tokens\": %zu, \"target_p50_usec\": %.0f, \"target_p99_usec\": %.0f, \"results\": [\n",
         prompt_tokens, lookup_p50_usec_max, lookup_p99_usec_max);
  for (size_t i = 0; i < r.lookups.size(); ++i) {
    const LookupResult& l = r.lookups[i];
    const bool pass = l.full.p50_usec <= lookup_p50_usec_max && l.full.p99_usec <= lookup_p99_usec_max;
    printf("   {\"block_tokens\": %u, \"clients\": %d, \"restorable_tokens\": %u, ", l.block_tokens,
           l.clients, l.restorable_tokens);
    print_percentiles("full", l.full, false);
    print_percentiles("socket_only", l.socket, false);
    printf("\"pass\": %s}%s\n", pass ? "true" : "false", i + 1 < r.lookups.size() ? "," : "");
    (pass ? r.passed : r.missed)++;
  }
  printf(" ], ");
  print_percentiles("socket_pingpong_floor", r.socket_floor, true);
  printf("},\n");
  const CopyResult& c = r.copy;
  printf(
      " \n \"copy\": {\"kernel\": \"%s\", \"pages\": \"%s\", \"bytes\": %llu, \"repetitions\": %d, "
      "\"target_ratio\": %.2f, \"memcpy_gib_per_sec\": %.3f, \"warm_reused_extent\": %s",
      kvpark::client::copy_kernel_name(kvpark::client::best_copy_kernel()), c.pages.c_str(),
      static_cast<unsigned long long>(c.bytes), c.repetitions, copy_ratio_min,
      gib_per_sec(c.bytes, c.memcpy_sec), c.warm_reused_extent ? "true" : "false");
  struct Line { const char* name; double sec; };
  const Line lines[] = {{"publish_first_touch", c.publish_first_sec},
                        {"publish_warm", c.publish_warm_sec},
                        {"restore_first_touch", c.restore_first_sec},
                        {"restore_warm", c.restore_warm_sec}};
  for (const Line& line : lines) {
    const double x = line.sec > 0 ? c.memcpy_sec / line.sec : 0;
    printf(",\n   \"%s\": {\"gib_per_sec\": %.3f, \"ratio\": %.3f, \"pass\": %s}", line.name,
           gib_per_sec(c.bytes, line.sec), x, x >= copy_ratio_min ? "true" : "false");
    (x >= copy_ratio_min ? r.passed : r.missed)++;
  }
  printf("},\n \"hash\": {\"prompt_tokens\": %zu, \"target_nsec_per_token\": %.0f, \"results\": [",
         prompt_tokens, hash_nsec_per_token_max);
  for (size_t i = 0; i < r.hashes.size(); ++i) {
    const HashResult& h = r.hashes[i];
    const bool pass = h.nsec_per_token <= hash_nsec_per_token_max;
    printf("%s{\"chunk_tokens\": %u, \"nsec_per_token\": %.3f, \"pass\": %s}", i ? ", " : "",
           h.chunk_tokens, h.nsec_per_token, pass ? "true" : "false");
    (pass ? r.passed : r.missed)++;
  }
  const MemoryResult& m = r.memory;
  printf("]},\n \"memory\": {\"blocks\": %zu, \"block_tokens\": %u, \"rss_anon_before_kib\": %llu, "
         "\"rss_anon_after_kib\": %llu, \"bytes_per_block\": %.1f},\n",
         m.blocks, memory_block_tokens, static_cast<unsigned long long>(m.rss_anon_before_kib),
         static_cast<unsigned long long>(m.rss_anon_after_kib), m.bytes_per_block);
  printf(" \"passed\": %d, \"missed\": %d}\n", r.passed, r.missed);
}

int fail(const char* section, const std::string& error) {
  fprintf(stderr, "kvpark-bench: %s: %s\n", section, error.c_str());
  return 1;
}

// The daemon commits every arena page before it is ready: a large arena takes a
// while, longer on a busy machine.
constexpr int daemon_ready_msec_base = 30'000;
constexpr int daemon_ready_msec_per_gib = 15'000;

// One section's kvparkd, killed with the bench if the bench dies first.
kvpark::testing::DaemonConfig section_daemon(const std::string& kvparkd, uint64_t arena_bytes) {
  return {.arena_bytes = arena_bytes,
          .kvparkd = kvparkd,
          .label = "bench",
          .ready_timeout_msec =
              daemon_ready_msec_base + int(arena_bytes >> 30) * daemon_ready_msec_per_gib,
          .die_with_parent = true};
}

// A section's failure with what the daemon said last (it may have died).
std::string with_log(const std::string& error, const kvpark::testing::DaemonProcess& daemon) {
  return error + "\nkvparkd's log ends:\n" + daemon.log_tail();
}

// Starts it; on failure ret_error holds the tail of its log.
bool start_daemon(kvpark::testing::DaemonProcess& daemon, std::string& ret_error) {
  if (daemon.start()) return true;
  ret_error = "kvparkd (" + daemon.config().kvparkd + ") did not become ready:\n" + daemon.log_tail();
  return false;
}

// SIGTERM and reap; false, with its log on stderr, unless it exited 0.
bool stop_daemon(kvpark::testing::DaemonProcess& daemon) {
  const int status = daemon.stop();
  const bool clean = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!clean) {
    fprintf(stderr, "kvpark-bench: kvparkd exited with status %d; its log:\n%s\n", status,
            daemon.log_tail().c_str());
  }
  return clean;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int exit_code = 0;
  if (!parse(argc, argv, o, exit_code)) return exit_code;
  const std::string kvparkd = kvpark::testing::find_kvparkd(o.kvparkd);
  if (kvparkd.empty() || access(kvparkd.c_str(), X_OK) != 0) {
    fprintf(stderr, "kvpark-bench: no kvparkd found%s%s; pass --kvparkd PATH\n",
            kvparkd.empty() ? "" : " at ", kvparkd.c_str());
    return 1;
  }
  const Sizes& z = o.quick ? quick_sizes : full_sizes;
  Report report;
  std::string error;
  int unclean_stops = 0;  // a daemon that crashes on SIGTERM is a bug: report it, keep the figures
  auto progress = [&](const char* what) {
    if (!o.json) fprintf(stderr, "kvpark-bench: %s...\n", what);
  };

  progress("1/4 lookup latency");
  {
    kvpark::testing::DaemonProcess daemon(section_daemon(kvparkd, 64ull << 20));
    if (!start_daemon(daemon, error)) return fail("lookup", error);
    const LookupConfig config = {.socket_path = daemon.socket_path(),
                                 .block_tokens = {64, 256},
                                 .clients = {1, 4},
                                 .iterations = z.lookup_iterations,
                                 .warmup = z.lookup_warmup};
    if (!run_lookup_bench(config, report.lookups, error)) return fail("lookup", with_log(error, daemon));
    report.socket_floor = run_socket_floor(z.lookup_iterations);
    if (!stop_daemon(daemon)) unclean_stops++;
  }
  progress("2/4 restore and publish throughput");
  for (const char* huge_pages : {"off", "try"}) {
    // Room for exactly one entry: each publish evicts the last and reuses its extent.
    const uint64_t arena = z.copy_bytes + (2ull << 20);
    kvpark::testing::DaemonConfig config = section_daemon(kvparkd, arena);
    config.reservation_bytes_max = arena;
    config.extra_args = {"--huge-pages", huge_pages};
    kvpark::testing::DaemonProcess daemon(config);
    if (!start_daemon(daemon, error)) return fail("copy", error);
    const CopyConfig copy = {.socket_path = daemon.socket_path(),
                             .bytes = z.copy_bytes,
                             .repetitions = z.copy_repetitions};
    CopyResult result;
    if (!run_copy_bench(copy, result, error)) return fail("copy", with_log(error, daemon));
    result.huge_pages = huge_pages;
    report.copies.push_back(result);
    report.copy = result;
    if (!stop_daemon(daemon)) unclean_stops++;
  }
  progress("attach to a large arena");
  {
    kvpark::testing::DaemonProcess daemon(section_daemon(kvparkd, z.attach_arena_bytes));
    if (!start_daemon(daemon, error)) return fail("attach", error);
    if (!run_attach_bench(daemon.socket_path(), z.attach_arena_bytes, 5, report.attach, error)) {
      return fail("attach", with_log(error, daemon));
    }
    if (!stop_daemon(daemon)) unclean_stops++;
  }
  progress("3/4 hashing");
  report.hashes = run_hash_bench(z.hash_repetitions);
  progress("4/4 daemon memory per block");
  {
    const uint64_t extent =
        kvpark::shm::extent_bytes_for(memory_block_tokens, memory_block_payload_bytes);
    const uint64_t arena = uint64_t(z.memory_blocks) * extent + (32ull << 20);
    kvpark::testing::DaemonProcess daemon(section_daemon(kvparkd, arena));
    if (!start_daemon(daemon, error)) return fail("memory", error);
    const MemoryConfig config = {.socket_path = daemon.socket_path(),
                                 .daemon_pid = daemon.pid(),
                                 .blocks = z.memory_blocks};
    if (!run_memory_bench(config, report.memory, error)) return fail("memory", with_log(error, daemon));
    if (!stop_daemon(daemon)) unclean_stops++;
  }
  if (o.json) {
    print_json(o, report, kvparkd);
  } else {
    print_table(o, z, report, kvparkd);
  }
  if (unclean_stops > 0) {
    fprintf(stderr, "kvpark-bench: %d kvparkd instance(s) did not stop cleanly on SIGTERM\n",
            unclean_stops);
    return 1;
  }
  return 0;
}
