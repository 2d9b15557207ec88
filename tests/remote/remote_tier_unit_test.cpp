// daemon/remote_tier.h without a daemon: its queue limit and its state, against a real
// redis-server that is stopped (SIGSTOP: it accepts connections and never answers); and
// the read model its load-versus-recompute decisions use.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <vector>

#include "daemon/remote_tier.h"
#include "remote/record_layout.h"
#include "tests/testing/eventually.h"
#include "tests/testing/redis_process.h"

namespace kvpark::daemon {
namespace {

TEST(RemoteTier, WriteBehindQueueRefusesPastItsLimit) {
  if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisProcess redis;
  ASSERT_TRUE(redis.start()) << redis.log_tail();
  RemoteTierOptions options;
  ASSERT_EQ(remote::parse_endpoints(redis.address(), options.seeds), Status::Ok);
  std::unique_ptr<RemoteTier> tier;
  ASSERT_EQ(RemoteTier::open(options, tier), Status::Ok);
  ASSERT_TRUE(testing::eventually("the tier reads the topology", [&] {
    std::vector<RemoteCompletion> done;
    tier->take_completions(done);
    return tier->stats().up;
  }));
  ASSERT_EQ(kill(redis.pid(), SIGSTOP), 0);  // the worker's next job hangs on it
  static const std::vector<uint8_t> payload(4096, 7);
  static const std::vector<int32_t> tokens(64, 1);
  const remote::ImageView image{.tokens = reinterpret_cast<const uint8_t*>(tokens.data()),
                                .tokens_bytes = tokens.size() * sizeof(int32_t),
                                .payload = payload.data(),
                                .payload_bytes = payload.size()};
  size_t accepted = 0;
  for (uint64_t i = 0; i < remote_puts_queued_max + 2; ++i) {
    const remote::EntryKey key{.ns = {1, 2}, .key_hash = {i, i}};
    if (!tier->put(key, remote::manifest_header_for(key), image, i, i)) break;
    ++accepted;
  }
  // The worker may have taken the first one off the queue before it hung.
  EXPECT_GE(accepted, remote_puts_queued_max);
  EXPECT_LE(accepted, remote_puts_queued_max + 1);
  EXPECT_EQ(tier->stats().puts_dropped, 1u);
  ASSERT_EQ(kill(redis.pid(), SIGCONT), 0);
  // Everything accepted completes (written or failed), nothing is lost.
  size_t completed = 0;
  EXPECT_TRUE(testing::eventually("every accepted write completes", [&] {
    std::vector<RemoteCompletion> done;
    tier->take_completions(done);
    for (const RemoteCompletion& d : done) completed += d.kind == RemoteJobKind::Put;
    return completed == accepted;
  }));
}

TEST(RemoteReadModel, UnmeasuredLoadsCostNothingSoTheStoreIsTried) {
  const RemoteReadModel model;
  EXPECT_EQ(model.load_seconds(8u << 20), 0.0);
}

TEST(RemoteReadModel, SmallRestoresMeasureLatencyAndLargeOnesBandwidth) {
  RemoteReadModel model;
  model.observe(16u << 10, 200);  // a block: its time is the round trips
  EXPECT_DOUBLE_EQ(model.latency_usec(), 200);
  EXPECT_EQ(model.bytes_per_second(), 0);
  model.observe(4u << 20, 4000);  // 4 MiB in 4 ms
  EXPECT_DOUBLE_EQ(model.bytes_per_second(), (4u << 20) / 4e-3);
  EXPECT_DOUBLE_EQ(model.latency_usec(), 200);
  // Under a MiB, the transfer at the measured bandwidth is taken off: 512 KiB took
  // 0.5 ms of transfer and 0.2 ms of latency, so the latency stays.
  model.observe(512u << 10, 700);
  EXPECT_NEAR(model.latency_usec(), 200, 1e-9);
  EXPECT_DOUBLE_EQ(model.bytes_per_second(), (4u << 20) / 4e-3);
  // An entry costs the latency and its bytes over the bandwidth.
  EXPECT_NEAR(model.load_seconds(8u << 20), 200e-6 + 8e-3, 1e-12);
}

TEST(RemoteReadModel, OneStallMovesTheLatencyLittleALastingSlowdownIsBelieved) {
  RemoteReadModel model;
  model.observe(16u << 10, 200);
  model.observe(16u << 10, 50'000);  // one stall: counted as 400 us
  EXPECT_NEAR(model.latency_usec(), 0.7 * 200 + 0.3 * 400, 1e-9);
  for (int i = 0; i < 30; ++i) model.observe(16u << 10, 5000);
  EXPECT_NEAR(model.latency_usec(), 5000, 50);  // within 1 %
}

TEST(RemoteReadModel, ATinyBlockOverASlowRoundTripIsRecomputedInstead) {
  RemoteReadModel model;
  model.observe(16u << 10, 2000);  // 2 ms a restore, e.g. a far or loaded store
  model.observe(8u << 20, 8000);   // 1 GB/s
  // 64 tokens at 100k tokens/s recompute in 0.64 ms: less than one round trip.
  EXPECT_GT(model.load_seconds(16u << 10), 64 / 100e3);
  // 64 tokens at 7k tokens/s take 9 ms: the store wins.
  EXPECT_LT(model.load_seconds(16u << 10), 64 / 7e3);
}

}  // namespace
}  // namespace kvpark::daemon
