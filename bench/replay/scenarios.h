// The shipped scenarios (a)-(g) of issue 4: trace generators and acceptance checks;
// and (a) across two hosts sharing a remote tier (issue 17): "a-remote" as shipped
// (a hybrid namespace) with the siblings on host B, and "a-blocks" / "a-remote-blocks"
// the same on one host and on two in an attention-only namespace.
// See docs/replay.md ("Scenarios") for what each one plays and checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/runner.h"

namespace kvpark::replay {

struct Scenario {
  std::string name;   // "a", "a-noauto", "b", ... "g"
  std::string title;
  std::string trace;  // JSONL
  uint64_t arena_bytes = 256ull << 20;
  bool disk = false;
  bool automatic_system_candidate = true;
  // Disk I/O runs at real speed, so a scenario that needs spills to keep pace with
  // publishing runs no faster than this (real sleep = modeled time * max(flag, this)).
  double time_scale_min = 0;
  // Hybrid (blocks and a required snapshot), as shipped; false: attention-only.
  bool snapshot_required = true;
  bool two_hosts = false;
  std::vector<uint32_t> engine_host;  // per engine (RunOptions::engine_host)
};

struct Verdict {
  bool pass = true;
  std::string figures;              // the key figures, one table cell
  std::vector<std::string> checks;  // "PASS ..." / "FAIL ..." lines
};

// Every scenario name, in order ("a" and "a-noauto" are the two runs of (a)). The
// cross-host runs ("a-remote", "a-blocks", "a-remote-blocks") need a redis-server and are
// not in it.
std::vector<std::string> scenario_names();
// What --scenario a-remote runs: (a) as shipped on one host and on two, then the same
// with blocks only.
std::vector<std::string> cross_host_scenario_names();
// Builds a scenario; quick halves the token counts (not (e), whose arena cannot shrink).
bool make_scenario(const std::string& name, bool quick, Scenario& ret);
Verdict judge(const Scenario& scenario, const RunOutcome& outcome, const RunOptions& options);

}  // namespace kvpark::replay
