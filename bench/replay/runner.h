// The replayer's coordinator: starts its own kvparkd (own socket, arena name and
// work directory under /var/tmp) or, for a run across two hosts, two of them (A and
// B: separate arenas and disk directories) sharing a redis-server it starts as their
// remote tier; forks one engine process per trace engine index (each on its host),
// dispatches the trace's events at their arrival times (scaled), restarts engines
// or the daemon when the trace says so, and collects one Result per request.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench/replay/engine.h"
#include "bench/replay/prompt.h"
#include "bench/replay/trace.h"
#include "client/kvpark.h"

namespace kvpark::replay {

struct RunOptions {
  std::string kvparkd;            // executable path
  EngineConfig engine;            // socket_path is filled in by run_trace
  uint64_t arena_bytes = 256ull << 20;
  bool disk = false;              // --disk-dir under the work directory
  bool keep_work_dir = false;
  // Two hosts: engine i runs against host engine_host[i] (0 = A, 1 = B; missing: A),
  // both daemons with `--remote` on one redis-server the run starts. Before a request
  // goes to B, A's engines finish and A's write-behinds settle, so what B finds in
  // the store does not depend on this machine's speed (the settle time is reported).
  bool two_hosts = false;
  std::vector<uint32_t> engine_host;
};

struct RequestRecord {
  size_t event = 0;               // index in the trace
  Result result;
  bool done = false;
  RenderedPrompt reference;       // the coordinator's own rendering (serial reference)
  uint32_t expected_cached = 0;   // deepest prefix parked (and not lost) before dispatch
  bool after_engine_restart = false;
  bool after_daemon_restart = false;
  bool has_stats = false;         // the trace asked for stats around this request
  kvpark_stats stats_before{};
  kvpark_stats stats_after{};
};

struct RunOutcome {
  bool ok = false;
  std::string error;
  std::vector<RequestRecord> requests;  // in trace order
  kvpark_stats final_stats{};
  uint64_t disk_entries_before_kill = 0;
  uint64_t disk_entries_after_restart = 0;
  uint64_t durable_entries_expected = 0;
  double wall_real_ms = 0;
  bool skipped = false;                       // a two-host run without redis-server (error says so)
  double remote_settle_ms = 0;                // real: waiting for A's write-behinds (two hosts)
  std::vector<std::map<std::string, uint64_t>> host_status;  // per host at the end: /v1/status numbers
};

RunOutcome run_trace(const std::vector<Event>& events, const RunOptions& options);

}  // namespace kvpark::replay
