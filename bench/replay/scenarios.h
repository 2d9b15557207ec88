// The shipped scenarios (a)-(g) of issue 4: trace generators and acceptance checks.
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
};

struct Verdict {
  bool pass = true;
  std::string figures;              // the key figures, one table cell
  std::vector<std::string> checks;  // "PASS ..." / "FAIL ..." lines
};

// Every scenario name, in order ("a" and "a-noauto" are the two runs of (a)).
std::vector<std::string> scenario_names();
// Builds a scenario; quick halves the token counts (not (e), whose arena cannot shrink).
bool make_scenario(const std::string& name, bool quick, Scenario& ret);
Verdict judge(const Scenario& scenario, const RunOutcome& outcome, const RunOptions& options);

}  // namespace kvpark::replay
