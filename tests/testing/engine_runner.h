// Helpers for process-level tests: run kvpark-test-engine against a DaemonProcess,
// read what it printed, and watch the daemon's counters from an in-process client.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {

// argv for kvpark-test-engine on `socket`: `args` (options and the mode, in any order).
inline std::vector<std::string> engine_argv(const std::string& socket,
                                            const std::vector<std::string>& args) {
  std::vector<std::string> argv = {built_binary("KVPARK_TEST_ENGINE"), "--socket", socket};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

struct EngineRun {
  int exit_code = -1;  // -1: did not finish in time
  std::string output;  // stdout
};

inline EngineRun run_engine(const DaemonProcess& daemon, const std::vector<std::string>& args,
                            int timeout_msec = 20'000) {
  EngineRun run;
  run.exit_code = run_process(engine_argv(daemon.socket_path(), args), timeout_msec, &run.output);
  return run;
}

inline ChildProcess spawn_engine(const DaemonProcess& daemon,
                                 const std::vector<std::string>& args) {
  return spawn_process(engine_argv(daemon.socket_path(), args));
}

// One "restored N KIND" line of the engine's output.
struct Restore {
  uint32_t tokens = 0;
  int reuse_kind = -1;
};

inline std::vector<Restore> restores_in(const std::string& output) {
  std::vector<Restore> restores;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    unsigned tokens = 0;
    int kind = -1;
    if (std::sscanf(line.c_str(), "restored %u %d", &tokens, &kind) == 2) {
      restores.push_back({tokens, kind});
    }
  }
  return restores;
}

// The count of every "published N" line, summed; -1 if there is none.
inline int64_t published_in(const std::string& output) {
  std::istringstream lines(output);
  std::string line;
  int64_t total = -1;
  while (std::getline(lines, line)) {
    unsigned long n = 0;
    if (std::sscanf(line.c_str(), "published %lu", &n) == 1) total = (total < 0 ? 0 : total) + n;
  }
  return total;
}

// Longest restorable prefix of an n-token prompt whose blocks are all parked:
// whole blocks, leaving at least one token to prefill.
inline uint32_t full_restore_tokens(uint32_t n_tokens, uint32_t block_tokens) {
  return (n_tokens - 1) / block_tokens * block_tokens;
}

// An in-process libkvpark client used to read the daemon's STATS. Its namespace
// (an id no test engine uses) never parks anything.
class StatsClient {
 public:
  explicit StatsClient(const std::string& socket) {
    kvpark_namespace ns{};
    ns.id = {0x57a75, 0x57a75};
    ns.block_tokens = 64;
    ns.block_payload_bytes = 4096;
    ns.client_name = "integration-stats";
    status_ = kvpark_connect(socket.c_str(), &ns, &client_);
  }
  ~StatsClient() { kvpark_disconnect(client_); }
  StatsClient(const StatsClient&) = delete;
  StatsClient& operator=(const StatsClient&) = delete;

  kvpark_status connect_status() const { return status_; }
  bool ok() const { return status_ == KVPARK_OK; }

  kvpark_stats get() {
    kvpark_stats s{};
    last_ = client_ != nullptr ? kvpark_get_stats(client_, &s) : status_;
    return s;
  }
  kvpark_status last_status() const { return last_; }

  // Reads STATS until `done` holds or `timeout_msec` passes; the last stats read.
  // Cleanup after a client dies is asynchronous to its death, so tests wait for it.
  bool wait_until(const std::function<bool(const kvpark_stats&)>& done, int timeout_msec,
                  kvpark_stats* ret_last = nullptr) {
    return kvpark::testing::wait_until(
        [&] {
          const kvpark_stats s = get();
          if (ret_last != nullptr) *ret_last = s;
          return last_ == KVPARK_OK && done(s);
        },
        timeout_msec);
  }

 private:
  kvpark_client* client_ = nullptr;
  kvpark_status status_ = KVPARK_UNAVAILABLE;
  kvpark_status last_ = KVPARK_UNAVAILABLE;
};

}  // namespace kvpark::testing
