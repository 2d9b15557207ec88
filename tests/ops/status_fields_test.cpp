// kvparkd's status table (daemon/status_fields.h) against the four doors a real daemon
// opens: every field reaches /v1/status, D-Bus Status() (and Stats() where it is a
// number, its property where it names one), kvparkctl status --json (and stats --json),
// and /metrics where it names a metric. A field added to the table and left out of a
// door fails here; so does a door that drops one.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <sdbus-c++/sdbus-c++.h>
#include <string>
#include <variant>
#include <vector>

#include "daemon/http_adapter.h"
#include "daemon/status_fields.h"
#include "proto/dbus_api.h"
#include "tests/ops/dbus_bus.h"
#include "tests/ops/http_get.h"
#include "tests/testing/daemon_process.h"

namespace kvpark::testing {
namespace {

constexpr int command_timeout_msec = 20'000;

std::string ctl_json(const std::string& verb) {
  std::string out;
  EXPECT_EQ(run_process({built_binary("KVPARKCTL"), "--user", "--json", verb},
                        command_timeout_msec, &out),
            0)
      << out;
  return out;
}

bool has_key(const std::string& json, const std::string& key) {
  return json.find("\"" + key + "\":") != std::string::npos;
}

// A sample line of /metrics: `name value` or `name{labels} value`.
bool has_sample(const std::string& metrics, const daemon::MetricSample& m) {
  const std::string head = std::string(m.metric) + (m.labels[0] == '\0' ? " " : "{" + std::string(m.labels) + "} ");
  return metrics.starts_with(head) || metrics.find("\n" + head) != std::string::npos;
}

TEST(StatusFields, EveryFieldReachesEveryDoor) {
  if (!PrivateBus::available()) GTEST_SKIP() << "dbus-daemon is not installed";
  PrivateBus bus;
  ASSERT_TRUE(bus.running());
  setenv("DBUS_SESSION_BUS_ADDRESS", bus.address().c_str(), 1);
  DaemonProcess daemon({.arena_bytes = 64ull << 20,
                        .extra_args = {"--dbus", "session", "--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start());
  const std::string json = http_get(daemon.http_port(), "/v1/status");
  const std::string metrics = http_get(daemon.http_port(), "/metrics");
  const std::string ctl_status = ctl_json("status");
  const std::string ctl_stats = ctl_json("stats");
  auto connection = sdbus::createSessionBusConnection();
  auto proxy =
      sdbus::createProxy(*connection, dbus_api::bus_name, dbus_api::object_path);
  std::map<std::string, sdbus::Variant> status;
  proxy->callMethod("Status").onInterface(dbus_api::interface_name).storeResultsTo(status);
  std::map<std::string, uint64_t> stats;
  proxy->callMethod("Stats").onInterface(dbus_api::interface_name).storeResultsTo(stats);

  size_t metric_fields = 0;
  for (const daemon::StatusField& f : daemon::status_fields()) {
    SCOPED_TRACE(f.key);
    EXPECT_TRUE(has_key(json, f.key)) << json;
    EXPECT_TRUE(has_key(ctl_status, f.key)) << ctl_status;
    EXPECT_TRUE(status.contains(f.key));
    const bool number = std::holds_alternative<uint64_t daemon::StatusInfo::*>(f.member);
    EXPECT_EQ(stats.contains(f.key), number);
    EXPECT_EQ(has_key(ctl_stats, f.key), number) << ctl_stats;
    if (f.dbus_property != nullptr) {
      EXPECT_NO_THROW(proxy->getProperty(f.dbus_property).onInterface(dbus_api::interface_name));
    }
    if (f.metric.metric != nullptr) {
      ++metric_fields;
      // The remote tier is off: its metrics are left out, the others all there.
      EXPECT_EQ(has_sample(metrics, f.metric), !f.remote_only) << metrics;
    }
  }
  EXPECT_GT(metric_fields, 50u);
  for (const auto& [key, value] : daemon::status_histogram_figures(daemon::StatusInfo{})) {
    SCOPED_TRACE(key);
    EXPECT_TRUE(has_key(json, key));
    EXPECT_TRUE(status.contains(key));
  }
  for (const daemon::StatusHistogram& h : daemon::status_histograms()) {
    SCOPED_TRACE(h.metric);
    EXPECT_EQ(metrics.find(std::string("# TYPE ") + h.metric + " histogram") != std::string::npos,
              !h.remote_only);
  }
}

// With the remote tier on, its metrics are written too.
TEST(StatusFields, RemoteMetricsAppearWithTheRemoteTier) {
  daemon::StatusInfo s;
  s.remote_enabled = true;
  const std::string metrics = daemon::render_metrics(s, {});
  for (const daemon::StatusField& f : daemon::status_fields()) {
    if (f.metric.metric == nullptr) continue;
    SCOPED_TRACE(f.key);
    EXPECT_TRUE(has_sample(metrics, f.metric)) << metrics;
  }
  for (const daemon::StatusHistogram& h : daemon::status_histograms()) {
    EXPECT_NE(metrics.find(std::string("# TYPE ") + h.metric + " histogram"), std::string::npos)
        << h.metric;
  }
}

}  // namespace
}  // namespace kvpark::testing
