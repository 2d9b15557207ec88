// The strict Prometheus text parser refuses what Prometheus would mis-read, and
// the daemon's metrics renderer passes it with every figure in place.
#include <gtest/gtest.h>

#include "daemon/http_adapter.h"
#include "proto/names.h"
#include "tests/ops/prometheus_parser.h"

namespace kvpark::testing {
namespace {

bool parses(const std::string& text, std::string* ret_error = nullptr) {
  PromDocument doc;
  std::string error;
  const bool ok = parse_prometheus_text(text, doc, error);
  if (ret_error != nullptr) *ret_error = error;
  return ok;
}

const char* const good =
    "# HELP a_total Things.\n# TYPE a_total counter\na_total 3\n"
    "# HELP b_bytes Bytes.\n# TYPE b_bytes gauge\nb_bytes{tier=\"host\",x=\"q\\\"\"} 1.5e3\n"
    "b_bytes{tier=\"disk\"} 0\n";

TEST(PrometheusParser, AcceptsWellFormedText) {
  PromDocument doc;
  std::string error;
  ASSERT_TRUE(parse_prometheus_text(good, doc, error)) << error;
  double v = 0;
  ASSERT_TRUE(doc.value("b_bytes", {{"tier", "host"}, {"x", "q\""}}, v));
  EXPECT_EQ(v, 1500);
  EXPECT_EQ(doc.families.at("a_total").type, "counter");
}

TEST(PrometheusParser, RefusesEachViolation) {
  const std::pair<const char*, const char*> cases[] = {
      {"a 1\n", "undeclared"},
      {"# TYPE a gauge\na 1\n", "HELP"},
      {"# HELP a x\na 1\n", "HELP or TYPE"},
      {"# HELP a x\n# TYPE a counter\na 1\n", "_total"},
      {"# HELP a_total x\n# TYPE a_total gauge\na_total 1\n", "only counters"},
      {"# HELP a x\n# TYPE a gauge\na 1\na 2\n", "duplicate series"},
      {"# HELP a x\n# TYPE a gauge\na one\n", "value"},
      {"# HELP a x\n# TYPE a gauge\n1a 1\n", "name"},
      {"# HELP a x\n# TYPE a gauge\na{1x=\"y\"} 1\n", "label"},
      {"# HELP a x\n# TYPE a gauge\na{x=\"y} 1\n", "unterminated"},
      {"# HELP a x\n# TYPE a gauge\na{x=\"y\",x=\"z\"} 1\n", "repeated"},
      {"# HELP a x\n# TYPE a wobble\na 1\n", "unknown type"},
      {"# HELP a x\n# TYPE a gauge\na 1\n# HELP b x\n# TYPE b gauge\nb 1\na{k=\"v\"} 2\n",
       "contiguous"},
      {"# HELP a x\n# TYPE a gauge\na 1\n# TYPE a gauge\n", "after the family"},
      {"# HELP a x\n# TYPE a gauge\na  1\n", "value"},
      {"# HELP a x\n# TYPE a gauge\na 1", "newline"},
      {"# HELP a_total x\n# TYPE a_total counter\na_total -1\n", "negative"},
  };
  for (const auto& [text, why] : cases) {
    std::string error;
    EXPECT_FALSE(parses(text, &error)) << text;
    EXPECT_NE(error.find(why), std::string::npos) << text << " -> " << error;
  }
}

TEST(MetricsRenderer, OutputPassesTheStrictParserWithEveryFigure) {
  daemon::StatusInfo s;
  s.version = "9.9.9";
  s.arena_data_bytes = 1000;
  s.arena_used_bytes = 600;
  s.arena_free_bytes = 400;
  s.blocks = 7;
  s.snapshots = 2;
  s.lookups = 11;
  s.lookup_hit_tokens = 4096;
  s.reuse_root = 3;
  s.reuse_shared_stable_prefix = 5;
  s.reuse_private_turn_closure = 3;
  s.evictions = 13;
  s.checksum_failures = 17;
  s.spill_bytes = 19;
  s.disk_bytes = 23;
  daemon::NamespaceSummary a;
  a.id = {1, 2};
  a.blocks = 7;
  a.host_bytes = 500;
  daemon::NamespaceSummary b;
  b.id = {3, 0};
  b.snapshots = 2;
  b.disk_bytes = 100;
  const std::string text = daemon::render_metrics(s, {a, b});
  PromDocument doc;
  std::string error;
  ASSERT_TRUE(parse_prometheus_text(text, doc, error)) << error << "\n" << text;
  const auto value = [&](const std::string& name, std::map<std::string, std::string> labels = {}) {
    double v = -1;
    EXPECT_TRUE(doc.value(name, labels, v)) << name;
    return v;
  };
  EXPECT_EQ(value("kvpark_build_info", {{"version", "9.9.9"}}), 1);
  EXPECT_EQ(value("kvpark_tier_used_bytes", {{"tier", "host"}}), 600);
  EXPECT_EQ(value("kvpark_tier_used_bytes", {{"tier", "disk"}}), 23);
  EXPECT_EQ(value("kvpark_entries", {{"kind", "block"}}), 7);
  EXPECT_EQ(value("kvpark_entries", {{"kind", "snapshot"}}), 2);
  EXPECT_EQ(value("kvpark_lookups_total"), 11);
  EXPECT_EQ(value("kvpark_lookup_hit_tokens_total"), 4096);
  EXPECT_EQ(value("kvpark_lookup_reuse_total", {{"kind", "shared_stable_prefix"}}), 5);
  EXPECT_EQ(value("kvpark_evictions_total"), 13);
  EXPECT_EQ(value("kvpark_checksum_failures_total"), 17);
  EXPECT_EQ(value("kvpark_spill_bytes_total"), 19);
  const std::string a_id = hex128(a.id);
  EXPECT_EQ(a_id, "00000000000000020000000000000001");
  EXPECT_EQ(value("kvpark_namespace_entries", {{"namespace", a_id}, {"kind", "block"}}), 7);
  EXPECT_EQ(value("kvpark_namespace_bytes", {{"namespace", a_id}, {"tier", "host"}}), 500);
  EXPECT_EQ(
      value("kvpark_namespace_bytes", {{"namespace", hex128(b.id)}, {"tier", "disk"}}),
      100);
  for (const auto& [name, family] : doc.families) {
    EXPECT_EQ(name.rfind("kvpark_", 0), 0u) << name;
  }
}

// /metrics rendered from a status and parsed strictly, with a sample lookup that fails
// the test when the sample is missing.
struct RenderedMetrics {
  explicit RenderedMetrics(const daemon::StatusInfo& s) {
    const std::string text = daemon::render_metrics(s, {});
    std::string error;
    parsed = parse_prometheus_text(text, doc, error);
    EXPECT_TRUE(parsed) << error << "\n" << text;
  }
  double value(const std::string& name, const std::map<std::string, std::string>& labels = {}) const {
    double v = -1;
    EXPECT_TRUE(doc.value(name, labels, v)) << name << " " << (labels.empty() ? "" : labels.begin()->second);
    return v;
  }
  PromDocument doc;
  bool parsed = false;
};

// The remote histograms: cumulative buckets in seconds written without exponents,
// +Inf equal to _count, _sum the observations' sum.
TEST(MetricsRenderer, RemoteLatencyIsAPrometheusHistogramInSeconds) {
  daemon::StatusInfo s;
  s.remote_enabled = true;
  s.remote_probe_latency.observe(50);        // le="0.00005"
  s.remote_probe_latency.observe(51);        // le="0.0001"
  s.remote_probe_latency.observe(20'000'000);  // only +Inf
  s.remote_write_latency.observe(2'500'000);  // le="2.5"
  const RenderedMetrics m(s);
  ASSERT_TRUE(m.parsed);
  const std::string probe = "kvpark_remote_probe_duration_seconds";
  EXPECT_EQ(m.doc.families.at(probe).type, "histogram");
  EXPECT_EQ(m.value(probe + "_bucket", {{"le", "0.00005"}}), 1);
  EXPECT_EQ(m.value(probe + "_bucket", {{"le", "0.0001"}}), 2);
  EXPECT_EQ(m.value(probe + "_bucket", {{"le", "10"}}), 2);
  EXPECT_EQ(m.value(probe + "_bucket", {{"le", "+Inf"}}), 3);
  EXPECT_EQ(m.value(probe + "_count"), 3);
  EXPECT_DOUBLE_EQ(m.value(probe + "_sum"), 20.000101);
  double previous = 0;
  size_t buckets = 0;
  for (const PromSample& sample : m.doc.families.at(probe).samples) {
    if (sample.name != probe + "_bucket") continue;
    EXPECT_GE(sample.value, previous) << "not cumulative at le=" << sample.labels.at("le");
    EXPECT_EQ(sample.labels.at("le").find('e'), std::string::npos) << sample.labels.at("le");
    previous = sample.value;
    ++buckets;
  }
  EXPECT_EQ(buckets, daemon::RemoteLatencyHistogram::bucket_count);
  const std::string write = "kvpark_remote_write_duration_seconds";
  EXPECT_EQ(m.value(write + "_bucket", {{"le", "1"}}), 0);
  EXPECT_EQ(m.value(write + "_bucket", {{"le", "2.5"}}), 1);
  EXPECT_EQ(m.value(write + "_count"), 1);
  EXPECT_EQ(m.value("kvpark_remote_restore_duration_seconds_count"), 0);
}

// The disk tier's histograms are written by the same code with their own bounds
// (0.5 ms .. 10 s): same names, `le` and `_sum` as exact decimal seconds.
TEST(MetricsRenderer, DiskLatencyIsAPrometheusHistogramWithTheDiskBounds) {
  daemon::StatusInfo s;
  s.spill_latency.observe(500);         // le="0.0005"
  s.spill_latency.observe(3'000);       // le="0.005"
  s.restore_latency.observe(20'000'000);  // only +Inf
  const RenderedMetrics m(s);
  ASSERT_TRUE(m.parsed);
  const std::string spill = "kvpark_spill_duration_seconds";
  EXPECT_EQ(m.doc.families.at(spill).type, "histogram");
  EXPECT_EQ(m.value(spill + "_bucket", {{"le", "0.0005"}}), 1);
  EXPECT_EQ(m.value(spill + "_bucket", {{"le", "0.0025"}}), 1);
  EXPECT_EQ(m.value(spill + "_bucket", {{"le", "0.005"}}), 2);
  EXPECT_EQ(m.value(spill + "_bucket", {{"le", "10"}}), 2);
  EXPECT_EQ(m.value(spill + "_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_DOUBLE_EQ(m.value(spill + "_sum"), 0.0035);
  EXPECT_EQ(m.value(spill + "_count"), 2);
  size_t buckets = 0;
  for (const PromSample& sample : m.doc.families.at(spill).samples) {
    if (sample.name == spill + "_bucket") ++buckets;
  }
  EXPECT_EQ(buckets, daemon::DiskLatencyHistogram::bucket_count);
  const std::string restore = "kvpark_restore_duration_seconds";
  EXPECT_EQ(m.value(restore + "_bucket", {{"le", "10"}}), 0);
  EXPECT_EQ(m.value(restore + "_bucket", {{"le", "+Inf"}}), 1);
  EXPECT_DOUBLE_EQ(m.value(restore + "_sum"), 20);
}

TEST(MetricsRenderer, NoNamespacesStillParses) {
  PromDocument doc;
  std::string error;
  EXPECT_TRUE(parse_prometheus_text(daemon::render_metrics({}, {}), doc, error)) << error;
}

}  // namespace
}  // namespace kvpark::testing
