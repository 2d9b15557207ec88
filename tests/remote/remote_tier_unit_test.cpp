// daemon/remote_tier.h without a daemon: its queue limit and its two lanes, against real
// redis-servers that are stopped (SIGSTOP: they accept connections and never answer);
// and the read model its load-versus-recompute decisions use.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <vector>

#include "daemon/remote_tier.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "remote/remote_store.h"
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

// A restore stuck on a node that does not answer must not hold a lookup's check on
// another node: the check has a budget, the restore only the socket timeout.
TEST(RemoteTier, ACheckIsAnsweredWhileARestoreHangsOnAStoppedNode) {
  if (testing::redis_server_path().empty()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisCluster cluster(3);
  ASSERT_TRUE(cluster.start()) << cluster.failure();
  remote::ClientOptions writer_options;
  ASSERT_EQ(remote::parse_endpoints(cluster.seeds(), writer_options.seeds), Status::Ok);
  remote::ClusterClient writer_client(writer_options);
  remote::RemoteStore writer(writer_client, remote::chunk_bytes_default);
  static const std::vector<uint8_t> payload(64 << 10, 7);
  static const std::vector<int32_t> tokens(64, 1);
  const remote::ImageView image{.tokens = reinterpret_cast<const uint8_t*>(tokens.data()),
                                .tokens_bytes = tokens.size() * sizeof(int32_t),
                                .payload = payload.data(),
                                .payload_bytes = payload.size()};
  auto node_of = [&](const remote::EntryKey& key) {
    for (size_t n = 0; n < cluster.size(); ++n) {
      if (cluster.node(n).cli({"EXISTS", remote::manifest_key(key)}) == "1\n") return n;
    }
    return cluster.size();
  };
  // The entry to restore, and one to check that lives on another node.
  const remote::EntryKey restored{.ns = {1, 2}, .key_hash = {3, 4}};
  ASSERT_EQ(writer.put(restored, remote::manifest_header_for(restored), image), Status::Ok);
  const size_t stuck = node_of(restored);
  ASSERT_LT(stuck, cluster.size());
  remote::EntryKey checked{};
  for (uint64_t i = 0; i < 64 && checked.key_hash == Hash128{}; ++i) {
    const remote::EntryKey k{.ns = {1, 2}, .key_hash = {5, i}};
    ASSERT_EQ(writer.put(k, remote::manifest_header_for(k), image), Status::Ok);
    if (node_of(k) != stuck) checked = k;
  }
  ASSERT_NE(checked.key_hash, Hash128{});
  std::vector<remote::ProbeResult> found;
  writer.probe({&restored, 1}, found);
  ASSERT_EQ(found[0].status, Status::Ok);

  RemoteTierOptions options;
  ASSERT_EQ(remote::parse_endpoints(cluster.seeds(), options.seeds), Status::Ok);
  options.io_timeout_msec = 120'000;  // the restore hangs for the whole test
  std::unique_ptr<RemoteTier> tier;
  ASSERT_EQ(RemoteTier::open(options, tier), Status::Ok);
  std::vector<RemoteCompletion> done;
  ASSERT_TRUE(testing::eventually("the tier reads the topology", [&] {
    tier->take_completions(done);
    return tier->stats().up;
  }));
  std::vector<int32_t> got_tokens(tokens.size());
  std::vector<uint8_t> got_payload(payload.size());
  const remote::ImageTarget target{.tokens = reinterpret_cast<uint8_t*>(got_tokens.data()),
                                   .tokens_bytes = got_tokens.size() * sizeof(int32_t),
                                   .payload = got_payload.data(),
                                   .payload_bytes = got_payload.size()};
  ASSERT_EQ(kill(cluster.node(stuck).pid(), SIGSTOP), 0);
  tier->get(restored, found[0].manifest, target, 1, 1);
  tier->probe({checked}, 2, 2);
  bool probed = false, got = false;
  Status got_status = Status::Unavailable;
  auto drain = [&] {
    tier->take_completions(done);
    for (const RemoteCompletion& d : done) {
      if (d.kind == RemoteJobKind::Probe) {
        probed = true;
        EXPECT_EQ(d.results.at(0).status, Status::Ok);
      }
      if (d.kind == RemoteJobKind::Get) got = true, got_status = d.status;
    }
  };
  EXPECT_TRUE(testing::eventually("the check is answered while the restore hangs", [&] {
    drain();
    return probed;
  }));
  EXPECT_FALSE(got) << "the restore's node was stopped";
  ASSERT_EQ(kill(cluster.node(stuck).pid(), SIGCONT), 0);
  EXPECT_TRUE(testing::eventually("the restore completes once the node answers", [&] {
    drain();
    return got;
  }));
  EXPECT_EQ(got_status, Status::Ok);
  EXPECT_EQ(got_tokens, tokens);
  EXPECT_EQ(got_payload, payload);
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
