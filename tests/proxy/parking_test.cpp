// kvpark-proxy's Parking against a real kvparkd, without an upstream: the proxy's
// connections to kvparkd across namespace changes.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <memory>
#include <string>
#include <vector>

#include "proxy/parking.h"
#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/openai_http.h"

namespace kvpark::testing {
namespace {

// More namespace changes than one process may hold connections
// (limits::connections_per_process_max): a model swapped this often must not lock
// the proxy out of kvparkd.
constexpr uint64_t namespace_changes = 100;

uint64_t daemon_connections(kvpark_client* observer) {
  kvpark_stats stats{};
  EXPECT_EQ(kvpark_get_stats(observer, &stats), KVPARK_OK);
  return stats.connections;
}

// Regression: each namespace change retired the old client with its connection still
// open, and after 63 changes kvparkd refused the proxy's process (64 per process):
// every request went uncached until the proxy restarted.
TEST(ProxyParking, NamespaceChangesCloseTheConnectionsTheyLeave) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  ClientPtr observer = connect_client(daemon.socket_path(), engine_namespace(1, 64, 4096));
  ASSERT_NE(observer, nullptr);
  proxy::Parking parking(daemon.socket_path(), "parking-test");
  const std::vector<int32_t> tokens = engine_prompt(5, 300);
  for (uint64_t i = 0; i < namespace_changes; ++i) {
    parking.set_namespace({.low = 0x9a7c + i, .high = 7}, 0);
    ASSERT_TRUE(parking.connected()) << "namespace change " << i;
    // A lookup's plan outlives the change that drops its client.
    std::unique_ptr<proxy::Parked> parked = parking.lookup(tokens, 1, 0, 0);
    ASSERT_NE(parked, nullptr);
    parking.set_namespace({.low = 0x1000000 + i, .high = 7}, 0);
    EXPECT_EQ(parked->position(), 0u);
    parked.reset();
    EXPECT_LE(daemon_connections(observer.get()), 2u) << "namespace change " << i;
  }
}

// The prefill rate kvparkd holds for the proxy's namespace (the one without blocks),
// from /v1/namespaces; -1 when it is not there.
int64_t proxy_prefill_rate(int http_port) {
  const HttpResult r = http_get("http://127.0.0.1:" + std::to_string(http_port), "/v1/namespaces");
  rapidjson::Document doc;
  if (r.status != 200 || doc.Parse(r.body.c_str()).HasParseError()) return -1;
  for (const auto& n : doc["namespaces"].GetArray()) {
    if (n["block_tokens"].GetUint() == 0) return n["prefill_tokens_per_second"].GetUint();
  }
  return -1;
}

// The proxy declares the prefill rate it measured (Route::note_prefill): kvparkd's value
// model weighs what a namespace's parked states save by it. A new connection says it in
// its HELLO; the old one serves until then and is closed after.
TEST(ProxyParking, ADeclaredPrefillRateReachesKvparkdOverANewConnectionThatReplacesTheOld) {
  DaemonProcess daemon({.extra_args = {"--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start());
  ClientPtr observer = connect_client(daemon.socket_path(), engine_namespace(1, 64, 4096));
  ASSERT_NE(observer, nullptr);
  proxy::Parking parking(daemon.socket_path(), "parking-test");
  parking.declare_prefill_rate(900);  // no namespace yet: nothing to declare it for
  parking.set_namespace({.low = 0x7a7e, .high = 7}, 0);
  ASSERT_TRUE(parking.connected());
  EXPECT_EQ(proxy_prefill_rate(daemon.http_port()), 0);
  const std::vector<int32_t> tokens = engine_prompt(5, 300);
  std::unique_ptr<proxy::Parked> parked = parking.lookup(tokens, 1, 0, 0);
  ASSERT_NE(parked, nullptr);
  parking.declare_prefill_rate(1234);
  EXPECT_EQ(proxy_prefill_rate(daemon.http_port()), 1234);
  EXPECT_TRUE(parking.connected());
  // The lookup's plan holds the old connection; then it goes.
  EXPECT_EQ(daemon_connections(observer.get()), 3u);
  parked.reset();
  EXPECT_TRUE(eventually("the old connection is closed",
                         [&] { return daemon_connections(observer.get()) == 2; }));
  parking.declare_prefill_rate(1234);  // unchanged: the same connection
  EXPECT_EQ(daemon_connections(observer.get()), 2u);
  EXPECT_EQ(proxy_prefill_rate(daemon.http_port()), 1234);
}

}  // namespace
}  // namespace kvpark::testing
