// kvpark-proxy's Parking against a real kvparkd, without an upstream: the proxy's
// connections to kvparkd across namespace changes.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "proxy/parking.h"
#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"

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

}  // namespace
}  // namespace kvpark::testing
