// The remote tier's latency histograms as an operator reads them, against real
// processes: one redis-server, host A publishing a shared head (write-behinds), host B
// restoring it (an existence check, entry restores). Each histogram's count must match
// the work its counters say was done, in /v1/status, in /metrics (a Prometheus
// histogram: cumulative buckets, +Inf = _count) and in `kvparkctl status` over a
// private D-Bus.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "tests/ops/ctl_runner.h"
#include "tests/ops/dbus_bus.h"
#include "tests/ops/prometheus_parser.h"
#include "tests/remote/remote_hosts.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/eventually.h"
#include "tests/testing/redis_process.h"

namespace kvpark::testing {
namespace {

constexpr uint32_t block_tokens = 64;
constexpr uint32_t head_tokens = 1024;  // 16 blocks of 64 KiB
constexpr uint32_t blocks_per_head = head_tokens / block_tokens;
constexpr int ctl_timeout_msec = 20'000;
// Nothing of these before the engines run (the queue has the start's topology read).
const char* const job_histograms[] = {"remote_probe", "remote_get", "remote_write"};

std::vector<std::string> head_args(std::vector<std::string> more) {
  std::vector<std::string> args = {
      "--head-seed", "3", "--head-tokens", std::to_string(head_tokens), "--block-bytes", "65536"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Each histogram of `host` in /metrics: a histogram family whose buckets are
// cumulative, +Inf and _count equal to the status' `<name>_timed`, and whose
// percentiles in status are ordered.
void expect_histograms_agree(const Host& host) {
  PromDocument doc;
  std::string error;
  ASSERT_TRUE(parse_prometheus_text(host.get("/metrics"), doc, error)) << error;
  const std::pair<const char*, const char*> families[] = {
      {"remote_probe", "kvpark_remote_probe_duration_seconds"},
      {"remote_get", "kvpark_remote_restore_duration_seconds"},
      {"remote_write", "kvpark_remote_write_duration_seconds"},
      {"remote_queue", "kvpark_remote_queue_duration_seconds"}};
  for (const auto& [name, family] : families) {
    SCOPED_TRACE(family);
    const std::string key = name;
    const uint64_t timed = host.status_required(key + "_timed");
    ASSERT_EQ(doc.families.count(family), 1u);
    EXPECT_EQ(doc.families.at(family).type, "histogram");
    double count = -1, inf = -1, sum = -1;
    ASSERT_TRUE(doc.value(std::string(family) + "_count", {}, count));
    ASSERT_TRUE(doc.value(std::string(family) + "_bucket", {{"le", "+Inf"}}, inf));
    ASSERT_TRUE(doc.value(std::string(family) + "_sum", {}, sum));
    EXPECT_EQ(count, static_cast<double>(timed));
    EXPECT_EQ(inf, count);
    double previous = 0;
    for (const PromSample& s : doc.families.at(family).samples) {
      if (s.name != std::string(family) + "_bucket") continue;
      EXPECT_GE(s.value, previous) << "le=" << s.labels.at("le");
      previous = s.value;
    }
    if (timed > 0) {
      EXPECT_GT(sum, 0);
      EXPECT_LE(host.status_required(key + "_usec_p50"), host.status_required(key + "_usec_p99"));
      EXPECT_LE(host.status_required(key + "_usec_p99"), host.status_required(key + "_usec_max"));
      EXPECT_GT(host.status_required(key + "_usec_max"), 0u);
    }
  }
  // Every job waited in the queue once: the three kinds timed here, and the rest
  // (topology refreshes, deletions).
  EXPECT_GE(host.status_required("remote_queue_timed"), host.status_required("remote_probe_timed") +
                                                   host.status_required("remote_get_timed") +
                                                   host.status_required("remote_write_timed"));
}

TEST(RemoteMetrics, LatencyHistogramsCountTheRemoteWorkDoneInStatusMetricsAndKvparkctl) {
  if (redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  if (!PrivateBus::available()) GTEST_SKIP() << "dbus-daemon is not installed";
  PrivateBus bus;
  ASSERT_TRUE(bus.running()) << "the private dbus-daemon did not start";
  setenv("DBUS_SESSION_BUS_ADDRESS", bus.address().c_str(), 1);
  setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/kvpark-test-system-bus", 1);
  RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  const std::string seeds = "redis://" + redis.address();
  Host a(seeds, "metrics-a");
  Host b(seeds, "metrics-b", "shared", /*dbus=*/true);
  ASSERT_TRUE(a.daemon->start()) << a.daemon->log_tail();
  ASSERT_TRUE(b.daemon->start()) << b.daemon->log_tail();
  for (const char* name : job_histograms) EXPECT_EQ(b.status_required(std::string(name) + "_timed"), 0u) << name;

  // A writes the head behind: one write-behind timed per block.
  ASSERT_EQ(run_engine(*a.daemon, head_args({"--shared", "publish"})).exit_code, 0);
  ASSERT_TRUE(eventually("A wrote the head behind", [&] {
    return a.status_required("remote_writes") >= blocks_per_head;
  })) << a.daemon->log_tail();
  ASSERT_TRUE(eventually("every write-behind of A is timed",
                         [&] { return a.status_required("remote_write_timed") == a.writes_done(); }));
  EXPECT_GE(a.status_required("remote_write_timed"), blocks_per_head);
  expect_histograms_agree(a);

  // B restores it from the store: its checks and restores are timed.
  const EngineRun run =
      run_engine(*b.daemon, head_args({"--session", "9", "--wait-msec", "10000", "verify"}));
  ASSERT_EQ(run.exit_code, 0) << run.output << b.daemon->log_tail();
  const std::vector<Restore> restores = restores_in(run.output);
  ASSERT_FALSE(restores.empty()) << run.output;
  EXPECT_EQ(restores.back().tokens, full_restore_tokens(head_tokens, block_tokens));
  ASSERT_TRUE(eventually("B's remote jobs settled", [&] {
    return b.status_required("remote_probe_timed") == b.status_required("remote_probes") &&
           b.status_required("remote_get_timed") == b.status_required("remote_hits") &&
           b.status_required("remote_write_timed") == b.writes_done();
  }));
  EXPECT_GE(b.status_required("remote_probe_timed"), 1u);
  EXPECT_GE(b.status_required("remote_get_timed"),
            full_restore_tokens(head_tokens, block_tokens) / block_tokens);
  expect_histograms_agree(b);

  // kvparkctl status over D-Bus: one line with each histogram's count and percentiles.
  const RunResult ctl =
      run_capture({built_binary("KVPARKCTL"), "--user", "status"}, ctl_timeout_msec);
  ASSERT_EQ(ctl.code, 0) << ctl.err;
  const std::string line =
      "    Latency: probe " + std::to_string(b.status_required("remote_probe_timed")) + " timed, p50 ";
  EXPECT_NE(ctl.out.find(line), std::string::npos) << ctl.out;
  EXPECT_NE(
      ctl.out.find("; restore " + std::to_string(b.status_required("remote_get_timed")) + " timed, p50 "),
      std::string::npos)
      << ctl.out;
  EXPECT_NE(ctl.out.find("; write "), std::string::npos) << ctl.out;
  EXPECT_NE(ctl.out.find("; queued "), std::string::npos) << ctl.out;
  // B's block restores (64 KiB payloads, under a MiB) measured the store's latency: the
  // load-versus-recompute model's input, in status and kvparkctl.
  const uint64_t latency_usec = b.status_required("remote_read_latency_usec");
  EXPECT_GT(latency_usec, 0u);
  EXPECT_NE(ctl.out.find(", " + std::to_string(latency_usec) + " us per restore"), std::string::npos)
      << ctl.out;
  unsetenv("DBUS_SESSION_BUS_ADDRESS");
  unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
}

}  // namespace
}  // namespace kvpark::testing
