// HTTP status and metrics from a real kvparkd over a real TCP socket: /metrics
// parsed strictly and cross-checked against /v1/status, JSON listings with
// filters, 400 on bad queries, 405 on anything but GET, reload on SIGHUP.
#include <gtest/gtest.h>
#include <httplib.h>
#include <rapidjson/document.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "proto/names.h"
#include "tests/integration/in_process.h"
#include "tests/ops/json_body.h"
#include "tests/ops/prometheus_parser.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr uint64_t ns_low = 0x5150;
constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 8192;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Fetched {
  int status = -1;
  std::string body;
  std::string content_type;
  std::string allow;
};

Fetched fetch(int port, const std::string& method, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result r = method == "GET"      ? client.Get(path.c_str())
                      : method == "POST"   ? client.Post(path.c_str(), "x", "text/plain")
                      : method == "PUT"    ? client.Put(path.c_str(), "x", "text/plain")
                      : method == "DELETE" ? client.Delete(path.c_str())
                                           : client.Options(path.c_str());
  Fetched f;
  if (!r) return f;
  f.status = r->status;
  f.body = r->body;
  f.content_type = r->get_header_value("Content-Type");
  f.allow = r->get_header_value("Allow");
  return f;
}

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{
        .extra_args = {"--config", "/dev/null", "--dbus", "off", "--http-listen", "127.0.0.1:0"}});
    ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
    port_ = daemon_->http_port();  // bound to port 0; the daemon names it at READY=1
    ASSERT_GT(port_, 0) << read_file(daemon_->log_path());
  }

  // Parks `blocks` blocks and looks them up once (a hit), holding the connection.
  void populate(size_t blocks) {
    const kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
    client_ = connect_client(daemon_->socket_path(), ns);
    ASSERT_TRUE(client_);
    const auto tokens = engine_prompt(7, blocks * block_tokens + 5);
    ASSERT_EQ(park_blocks(client_.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
    kvpark_plan* plan = nullptr;
    ASSERT_EQ(kvpark_lookup(client_.get(), 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
    EXPECT_EQ(kvpark_plan_restorable_tokens(plan), blocks * block_tokens);
    kvpark_plan_release(plan);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  ClientPtr client_;
  int port_ = -1;
};

TEST_F(HttpTest, MetricsParseStrictlyAndAgreeWithStatus) {
  populate(6);
  const Fetched metrics = fetch(port_, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_EQ(metrics.content_type, "text/plain; version=0.0.4; charset=utf-8");
  PromDocument doc;
  std::string error;
  ASSERT_TRUE(parse_prometheus_text(metrics.body, doc, error)) << error << "\n" << metrics.body;

  const Fetched status_reply = fetch(port_, "GET", "/v1/status");
  ASSERT_EQ(status_reply.status, 200);
  EXPECT_EQ(status_reply.content_type, "application/json");
  const rapidjson::Document s = json(status_reply.body);
  const auto field = [&](const char* key) {
    EXPECT_TRUE(s.HasMember(key)) << key;
    return s.HasMember(key) ? static_cast<double>(s[key].GetUint64()) : -1.0;
  };
  const auto metric = [&](const std::string& name, std::map<std::string, std::string> labels = {}) {
    double v = -1;
    EXPECT_TRUE(doc.value(name, labels, v)) << name;
    return v;
  };
  EXPECT_EQ(field("blocks"), 6);
  EXPECT_EQ(metric("kvpark_entries", {{"kind", "block"}}), field("blocks"));
  EXPECT_EQ(metric("kvpark_entries", {{"kind", "snapshot"}}), field("snapshots"));
  EXPECT_EQ(metric("kvpark_tier_used_bytes", {{"tier", "host"}}), field("arena_used_bytes"));
  EXPECT_EQ(metric("kvpark_tier_capacity_bytes", {{"tier", "host"}}), field("arena_data_bytes"));
  EXPECT_EQ(metric("kvpark_tier_used_bytes", {{"tier", "disk"}}), field("disk_bytes"));
  EXPECT_EQ(metric("kvpark_arena_free_bytes"), field("arena_free_bytes"));
  EXPECT_EQ(metric("kvpark_namespaces"), field("namespaces"));
  EXPECT_EQ(metric("kvpark_namespaces_reused_total"), field("namespaces_reused"));
  EXPECT_EQ(metric("kvpark_connections"), field("connections"));
  EXPECT_EQ(metric("kvpark_leases"), field("leases"));
  EXPECT_EQ(metric("kvpark_pinned_entries"), field("pinned"));
  EXPECT_EQ(metric("kvpark_lookups_total"), field("lookups"));
  EXPECT_GE(field("lookups"), 1);
  EXPECT_EQ(metric("kvpark_lookup_hit_tokens_total"), field("lookup_hit_tokens"));
  EXPECT_GE(field("lookup_hit_tokens"), 6 * block_tokens);
  EXPECT_EQ(metric("kvpark_lookup_reuse_total", {{"kind", "root"}}), field("reuse_root"));
  EXPECT_EQ(metric("kvpark_lookup_reuse_total", {{"kind", "shared_stable_prefix"}}),
            field("reuse_shared_stable_prefix"));
  EXPECT_EQ(metric("kvpark_lookup_reuse_total", {{"kind", "private_turn_closure"}}),
            field("reuse_private_turn_closure"));
  EXPECT_EQ(metric("kvpark_evictions_total"), field("evictions"));
  EXPECT_EQ(metric("kvpark_dedup_hits_total"), field("dedup_hits"));
  EXPECT_EQ(metric("kvpark_protocol_errors_total"), field("protocol_errors"));
  EXPECT_EQ(metric("kvpark_checksum_failures_total"), field("checksum_failures"));
  EXPECT_EQ(metric("kvpark_spill_bytes_total"), field("spill_bytes"));
  EXPECT_EQ(metric("kvpark_restore_bytes_total"), field("restore_bytes"));
  const std::string ns_hex = hex128({.low = ns_low});
  EXPECT_EQ(metric("kvpark_namespace_entries", {{"namespace", ns_hex}, {"kind", "block"}}), 6);
  EXPECT_GT(metric("kvpark_namespace_bytes", {{"namespace", ns_hex}, {"tier", "host"}}), 0);
}

// A client that looks up N restorable tokens but restores only M (the first blocks)
// reports M: status, the per-namespace listing and /metrics say M restored next to N
// restorable, in total and per namespace.
TEST_F(HttpTest, TokensRestoredAreWhatClientsRestoredNotWhatLookupsFound) {
  constexpr size_t blocks = 6;
  constexpr size_t restored_blocks = 2;
  const kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
  client_ = connect_client(daemon_->socket_path(), ns);
  ASSERT_TRUE(client_);
  const auto tokens = engine_prompt(9, blocks * block_tokens + 5);
  ASSERT_EQ(park_blocks(client_.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client_.get(), 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  const uint32_t restorable = kvpark_plan_restorable_tokens(plan);
  ASSERT_EQ(restorable, blocks * block_tokens);
  std::vector<uint8_t> block(block_bytes);
  for (size_t i = 0; i < restored_blocks; ++i)
    ASSERT_EQ(kvpark_plan_copy_block(plan, i, block.data()), KVPARK_OK);
  const uint32_t restored = restored_blocks * block_tokens;
  kvpark_plan_set_restored_tokens(plan, restored);
  kvpark_plan_release(plan);
  // A second plan of the same prompt, released unused, restored nothing; one that
  // claims more than its lease covered is counted at what it covered.
  ASSERT_EQ(kvpark_lookup(client_.get(), 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  kvpark_plan_release(plan);
  const std::vector<int32_t> short_prompt(tokens.begin(), tokens.begin() + block_tokens + 1);
  ASSERT_EQ(kvpark_lookup(client_.get(), 2, short_prompt.data(), short_prompt.size(), &plan),
            KVPARK_OK);
  ASSERT_EQ(kvpark_plan_restorable_tokens(plan), block_tokens);
  kvpark_plan_set_restored_tokens(plan, 100'000);
  kvpark_plan_release(plan);
  const uint64_t want_restored = restored + block_tokens;
  const uint64_t want_restorable = 2 * restorable + block_tokens;

  // Releases are one way: wait until the daemon has counted the last one (no lease open).
  rapidjson::Document s;
  ASSERT_TRUE(wait_until(
      [&] {
        s = json(fetch(port_, "GET", "/v1/status").body);
        return s.HasMember("leases") && s["leases"].GetUint64() == 0;
      },
      5'000));
  ASSERT_TRUE(s.HasMember("restored_tokens"));
  EXPECT_EQ(s["restored_tokens"].GetUint64(), want_restored);
  EXPECT_EQ(s["lookup_hit_tokens"].GetUint64(), want_restorable);

  const rapidjson::Document spaces = json(fetch(port_, "GET", "/v1/namespaces").body);
  ASSERT_EQ(spaces["namespaces"].Size(), 1u);
  EXPECT_EQ(spaces["namespaces"][0]["restored_tokens"].GetUint64(), want_restored);
  EXPECT_EQ(spaces["namespaces"][0]["restorable_tokens"].GetUint64(), want_restorable);

  PromDocument doc;
  std::string error;
  const Fetched metrics = fetch(port_, "GET", "/metrics");
  ASSERT_TRUE(parse_prometheus_text(metrics.body, doc, error)) << error;
  double v = -1;
  ASSERT_TRUE(doc.value("kvpark_restored_tokens_total", {}, v));
  EXPECT_EQ(v, double(want_restored));
  ASSERT_TRUE(doc.value("kvpark_lookup_hit_tokens_total", {}, v));
  EXPECT_EQ(v, double(want_restorable));
  const std::string ns_hex = hex128({.low = ns_low});
  ASSERT_TRUE(doc.value("kvpark_namespace_restored_tokens_total", {{"namespace", ns_hex}}, v));
  EXPECT_EQ(v, double(want_restored));
  ASSERT_TRUE(doc.value("kvpark_namespace_restorable_tokens_total", {{"namespace", ns_hex}}, v));
  EXPECT_EQ(v, double(want_restorable));
}

TEST_F(HttpTest, PromtoolAcceptsMetricsWhenInstalled) {
  if (access("/usr/bin/promtool", X_OK) != 0) GTEST_SKIP() << "promtool is not installed";
  populate(2);
  const Fetched metrics = fetch(port_, "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  const std::string path = daemon_->log_path() + ".metrics";
  std::ofstream(path) << metrics.body;
  std::string output;
  const int code =
      run_process({"/bin/sh", "-c", "promtool check metrics < " + path + " 2>&1"}, 20'000, &output);
  EXPECT_EQ(code, 0) << output;
  unlink(path.c_str());
}

TEST_F(HttpTest, NamespacesAndFilteredEntries) {
  populate(5);
  const rapidjson::Document spaces = json(fetch(port_, "GET", "/v1/namespaces").body);
  ASSERT_TRUE(spaces["namespaces"].IsArray());
  ASSERT_EQ(spaces["namespaces"].Size(), 1u);
  const std::string id = spaces["namespaces"][0]["id"].GetString();
  EXPECT_EQ(spaces["namespaces"][0]["blocks"].GetUint64(), 5u);
  EXPECT_EQ(spaces["namespaces"][0]["block_tokens"].GetUint(), block_tokens);

  const rapidjson::Document page =
      json(fetch(port_, "GET", "/v1/entries?namespace=" + id + "&limit=2&offset=1").body);
  EXPECT_EQ(page["total"].GetUint64(), 5u);
  ASSERT_EQ(page["entries"].Size(), 2u);
  EXPECT_STREQ(page["entries"][0]["kind"].GetString(), "block");
  EXPECT_STREQ(page["entries"][0]["tier"].GetString(), "host");
  EXPECT_STREQ(page["entries"][0]["namespace"].GetString(), id.c_str());
  EXPECT_STREQ(page["entries"][0]["class"].GetString(), "private");

  EXPECT_EQ(json(fetch(port_, "GET", "/v1/entries?tier=disk").body)["total"].GetUint64(), 0u);
  EXPECT_EQ(json(fetch(port_, "GET", "/v1/entries?class=shared").body)["total"].GetUint64(), 0u);
  EXPECT_EQ(
      json(fetch(port_, "GET", "/v1/entries?class=private&tier=host").body)["total"].GetUint64(),
      5u);
  EXPECT_EQ(json(fetch(port_, "GET", "/v1/entries?namespace=" + std::string(32, 'f')).body)["total"]
                .GetUint64(),
            0u);
  // The id grammar D-Bus and kvparkctl read too: leading zeros may go, 0x may come first.
  std::string short_id = id.substr(id.find_first_not_of('0'));
  for (const std::string& form : {short_id, "0x" + short_id, "0x" + id}) {
    EXPECT_EQ(json(fetch(port_, "GET", "/v1/entries?namespace=" + form).body)["total"].GetUint64(),
              5u)
        << form;
  }
}

TEST_F(HttpTest, BadQueriesAreRefusedWith400AndAJsonError) {
  for (const char* query : {"limit=0", "limit=1001", "limit=abc", "offset=-1", "tier=ssd",
                            "class=public", "namespace=xyz", "namespace=", "namespace=0x",
                            "namespace="
                            "0123456789abcdef0123456789abcdeg",
                            "namespace="
                            "0123456789abcdef0123456789abcdef0",
                            "colour=blue", "limit=1&limit=2"}) {
    const Fetched f = fetch(port_, "GET", std::string("/v1/entries?") + query);
    EXPECT_EQ(f.status, 400) << query;
    const rapidjson::Document d = json(f.body);
    EXPECT_TRUE(d.IsObject() && d.HasMember("error") && d["error"].IsString()) << query << f.body;
  }
  EXPECT_EQ(fetch(port_, "GET", "/v1/entries?limit=1000").status, 200);
}

TEST_F(HttpTest, OnlyGetIsAllowed) {
  for (const char* path : {"/metrics", "/v1/status", "/v1/namespaces", "/v1/entries", "/other"}) {
    for (const char* method : {"POST", "PUT", "DELETE", "OPTIONS"}) {
      const Fetched f = fetch(port_, method, path);
      EXPECT_EQ(f.status, 405) << method << " " << path;
      EXPECT_EQ(f.allow, "GET, HEAD") << method << " " << path;
    }
  }
  const Fetched missing = fetch(port_, "GET", "/v2/nothing");
  EXPECT_EQ(missing.status, 404);
  EXPECT_TRUE(json(missing.body).HasMember("error"));
}

TEST(HttpReload, SighupAppliesRuntimeKeysAndNamesTheRest) {
  char templ[] = "/tmp/kvparkd-reload-XXXXXX";
  const std::string dir = mkdtemp(templ);
  const std::string conf = dir + "/kvparkd.conf";
  std::ofstream(conf) << "arena_low_water = 0\nhttp_listen = 127.0.0.1:0\ndbus = off\n";
  DaemonProcess daemon(
      DaemonConfig{.extra_args = {"--config", conf, "--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start()) << read_file(daemon.log_path());
  const int port = daemon.http_port();
  ASSERT_GT(port, 0);
  EXPECT_EQ(json(fetch(port, "GET", "/v1/status").body)["arena_low_water_bytes"].GetUint64(), 0u);

  std::ofstream(conf) << "arena_low_water = 4M\nreservation_max = 8M\nhttp_listen = 127.0.0.1:0\n"
                         "dbus = off\nattach_group = nobody\n";
  // A reload ends with READY=1 again (the notify protocol's reload cycle).
  ASSERT_EQ(kill(daemon.pid(), SIGHUP), 0);
  std::string reloaded;
  ASSERT_TRUE(daemon.wait_notify("READY=1", wait_timeout_msec_default, &reloaded))
      << read_file(daemon.log_path());
  const rapidjson::Document s = json(fetch(port, "GET", "/v1/status").body);
  EXPECT_EQ(s["arena_low_water_bytes"].GetUint64(), 4u << 20);
  EXPECT_EQ(s["reservation_bytes_max"].GetUint64(), 8u << 20);
  const std::string log = read_file(daemon.log_path());
  EXPECT_NE(log.find("needs a restart: attach_group"), std::string::npos) << log;

  // A broken file changes nothing and says where it is broken.
  std::ofstream(conf) << "arena_low_water = 2M\nbogus = 1\n";
  ASSERT_EQ(kill(daemon.pid(), SIGHUP), 0);
  ASSERT_TRUE(daemon.wait_notify("READY=1", wait_timeout_msec_default, &reloaded))
      << read_file(daemon.log_path());
  EXPECT_NE(reloaded.find("not reloaded"), std::string::npos) << reloaded;
  const std::string after = read_file(daemon.log_path());  // logged before READY=1 was sent
  EXPECT_NE(after.find(conf + ":2: unknown key 'bogus'"), std::string::npos) << after;
  EXPECT_EQ(json(fetch(port, "GET", "/v1/status").body)["arena_low_water_bytes"].GetUint64(),
            4u << 20);
  EXPECT_EQ(daemon.stop(), 0);
  unlink(conf.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace kvpark::testing
