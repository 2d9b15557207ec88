// What an operator sees after a restart that adopted the arena: the HTTP status API,
// /metrics and `kvparkctl status` say how many entries (and bytes) came from the
// previous instance, in how long, and how many records were dropped and why.
#include <gtest/gtest.h>
#include <httplib.h>

#include <string>
#include <vector>

#include "tests/ops/ctl_runner.h"
#include "tests/ops/http_get.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

constexpr int command_timeout_msec = 20'000;

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(AdoptionStatus, StatusMetricsAndKvparkctlSayWhatWasAdopted) {
  DaemonProcess daemon({.arena_bytes = 64ull << 20,
                        .extra_args = {"--http-listen", "127.0.0.1:0"},
                        .fd_store = true});
  ASSERT_TRUE(daemon.start());
  EngineRun run = run_engine(daemon, {"publish", "--head-seed", "751"});  // 16 blocks
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // Made new: nothing adopted, nothing to explain.
  std::string status = http_get(daemon.http_port(), "/v1/status");
  EXPECT_TRUE(contains(status, "\"arena_adopted\":false")) << status;

  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  const int port = daemon.http_port();
  status = http_get(port, "/v1/status");
  EXPECT_TRUE(contains(status, "\"arena_adopted\":true")) << status;
  EXPECT_TRUE(contains(status, "\"adopted_entries\":16")) << status;
  EXPECT_TRUE(contains(status, "\"adopted_bytes\":" + std::to_string(16 * (68 << 10)))) << status;
  EXPECT_TRUE(contains(status, "\"adoption_dropped\":0")) << status;
  EXPECT_TRUE(contains(status, "adopted 16 entries (0.00 GiB) from the previous instance in "))
      << status;

  const std::string metrics = http_get(port, "/metrics");
  EXPECT_TRUE(contains(metrics, "\nkvpark_arena_adopted 1\n")) << metrics;
  EXPECT_TRUE(contains(metrics, "\nkvpark_adopted_entries 16\n")) << metrics;
  EXPECT_TRUE(contains(metrics, "kvpark_adoption_dropped{reason=\"damaged\"} 0")) << metrics;
  EXPECT_TRUE(contains(metrics, "\nkvpark_adoption_seconds ")) << metrics;

  const RunResult ctl = run_capture(
      {built_binary("KVPARKCTL"), "--http", "127.0.0.1:" + std::to_string(port), "status"},
      command_timeout_msec);
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_TRUE(
      contains(ctl.out, "Restart: adopted 16 entries (0.00 GiB) from the previous instance in "))
      << ctl.out;
  EXPECT_TRUE(contains(ctl.out, "; dropped 0")) << ctl.out;
  EXPECT_TRUE(contains(status, "\"adoption_index_kept\":false")) << status;  // killed: rebuilt
  EXPECT_TRUE(contains(metrics, "\nkvpark_adoption_index_kept 0\n")) << metrics;

  // A clean stop leaves its index, and the next start says it took it.
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());
  const int next_port = daemon.http_port();
  status = http_get(next_port, "/v1/status");
  EXPECT_TRUE(contains(status, "\"adoption_index_kept\":true")) << status;
  EXPECT_TRUE(contains(http_get(next_port, "/metrics"), "\nkvpark_adoption_index_kept 1\n"));
  const RunResult kept = run_capture(
      {built_binary("KVPARKCTL"), "--http", "127.0.0.1:" + std::to_string(next_port), "status"},
      command_timeout_msec);
  ASSERT_EQ(kept.code, 0) << kept.err;
  EXPECT_TRUE(contains(kept.out, "from the previous instance in ")) << kept.out;
  EXPECT_TRUE(contains(kept.out, ", its index kept; dropped 0")) << kept.out;
}

TEST(AdoptionStatus, AFreshStartOverKeptFdsSaysWhy) {
  DaemonProcess daemon({.arena_bytes = 64ull << 20,
                        .extra_args = {"--http-listen", "127.0.0.1:0"},
                        .fd_store = true});
  ASSERT_TRUE(daemon.start());
  ASSERT_EQ(daemon.stop(), 0);
  daemon.config().arena_bytes = 32ull << 20;
  ASSERT_TRUE(daemon.start());
  const RunResult ctl = run_capture({built_binary("KVPARKCTL"), "--http",
                                     "127.0.0.1:" + std::to_string(daemon.http_port()), "status"},
                                    command_timeout_msec);
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  EXPECT_TRUE(contains(ctl.out,
                       "Restart: started with an empty arena: the kept arena is 64 MiB, the "
                       "configuration asks for 32 MiB"))
      << ctl.out;
}

}  // namespace
}  // namespace kvpark::testing
