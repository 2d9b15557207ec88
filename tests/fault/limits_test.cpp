// Every limit a client controls, at N and N+1, against a real kvparkd:
// connections, leases and reservations per connection, reservation bytes,
// blocks per RESERVE, tokens and chunks per LOOKUP, namespaces. And a peer that never reads
// its replies must not stall anyone else.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <memory>

#include "proto/limits.h"
#include "proto/wire.h"
#include "shm/arena_format.h"
#include "tests/fault/observer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/raw_client.h"

namespace kvpark::testing {
namespace {

using Received = RawClient::Received;

struct ClientDeleter {
  void operator()(kvpark_client* c) const { kvpark_disconnect(c); }
};
using ClientPtr = std::unique_ptr<kvpark_client, ClientDeleter>;

kvpark_namespace make_ns(uint64_t id, uint32_t block_tokens, uint64_t block_bytes) {
  return {.id = {id, 0x11},
          .block_tokens = block_tokens,
          .block_payload_bytes = block_bytes,
          .snapshot_required = 0,
          .prefill_tokens_per_second = 0,
          .client_name = "limits"};
}

class Limits : public ::testing::Test {
 protected:
  void start(DaemonConfig config = {}) {
    daemon_ = std::make_unique<DaemonProcess>(config);
    ASSERT_TRUE(daemon_->start()) << "kvparkd did not start; log: " << daemon_->log_path();
    ASSERT_EQ(observer_.connect(daemon_->socket_path()), KVPARK_OK);
    observer_.publish_and_verify();
    baseline_ = observer_.stats();
  }
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  }
  void TearDown() override {
    if (daemon_ == nullptr || !daemon_->running()) return;
    observer_.publish_and_verify();
    EXPECT_EQ(observer_.stats().protocol_errors, baseline_.protocol_errors + expected_errors_);
    EXPECT_EQ(daemon_->stop(), 0);
  }
  ClientPtr connect(const kvpark_namespace& ns, kvpark_status expected = KVPARK_OK) {
    kvpark_client* c = nullptr;
    EXPECT_EQ(kvpark_connect(daemon_->socket_path().c_str(), &ns, &c), expected);
    return ClientPtr(c);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  Observer observer_;
  kvpark_stats baseline_{};
  uint64_t expected_errors_ = 0;
};

// One process holds at most connections_per_process_max connections (the global and
// per-uid caps take several processes: tests/fault/admission_test.cpp).
TEST_F(Limits, ConnectionsPerProcessAtCapAndCapPlusOne) {
  start();
  // The observer holds one connection; raw peers, each greeted so the handshake
  // deadline leaves them alone, take the rest.
  std::vector<RawClient> peers;
  for (size_t i = 1; i < limits::connections_per_process_max; ++i) {
    peers.emplace_back(daemon_->socket_path());
    ASSERT_TRUE(peers.back().connected()) << i;
    ASSERT_EQ(peers.back().hello({0xc1, i}, {.block_tokens = 16, .block_payload_bytes = 4096}),
              Status::Ok)
        << i;
  }
  EXPECT_TRUE(eventually("the daemon counts every connection",
                         [&] { return observer_.stats().connections >= limits::connections_per_process_max; }));
  EXPECT_EQ(observer_.stats().connections, limits::connections_per_process_max);
  // N+1: refused with a clear status, and the daemon keeps N.
  const kvpark_namespace ns = make_ns(0xc0, 16, 3584);
  connect(ns, KVPARK_LIMIT_EXCEEDED);
  EXPECT_EQ(observer_.stats().connections, limits::connections_per_process_max);
  observer_.publish_and_verify();
  // Closing one admits one more.
  peers.pop_back();
  EXPECT_TRUE(eventually("the daemon sees the closed connection",
                         [&] { return observer_.stats().connections < limits::connections_per_process_max; }));
  ClientPtr admitted = connect(ns);
  ASSERT_NE(admitted, nullptr);
  connect(ns, KVPARK_LIMIT_EXCEEDED);
  admitted.reset();
  peers.clear();
  observer_.expect_back_to(baseline_);
}

TEST_F(Limits, LeasesPerConnectionAtCapAndCapPlusOne) {
  start();
  const kvpark_namespace ns = make_ns(0x1ea5e, 16, 3584);
  ClientPtr c = connect(ns);
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> tokens = make_tokens(5, 2 * 16 + 1);
  kvpark_publish_options options{.session_id = 1};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, 2, &r),
            KVPARK_OK);
  ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
  kvpark_stats settled = observer_.stats();  // the two parked blocks stay
  settled.connections = baseline_.connections;
  std::vector<kvpark_plan*> plans;
  for (size_t i = 0; i < limits::leases_per_connection_max; ++i) {
    kvpark_plan* plan = nullptr;
    ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), tokens.size(), &plan), KVPARK_OK) << i;
    ASSERT_EQ(kvpark_plan_restorable_tokens(plan), 32u);
    plans.push_back(plan);
  }
  EXPECT_EQ(observer_.stats().leases, baseline_.leases + limits::leases_per_connection_max);
  kvpark_plan* plan = nullptr;
  EXPECT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), tokens.size(), &plan),
            KVPARK_LIMIT_EXCEEDED);
  observer_.publish_and_verify();  // the cap is per connection
  kvpark_plan_release(plans.back());
  plans.pop_back();
  ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  plans.push_back(plan);
  EXPECT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), tokens.size(), &plan),
            KVPARK_LIMIT_EXCEEDED);
  for (kvpark_plan* p : plans) kvpark_plan_release(p);
  c.reset();
  observer_.expect_back_to(settled);  // releases may be one-way: wait for them to land
}

TEST_F(Limits, ReservationBytesAtCapAndOneGranuleMore) {
  // 64-token blocks whose payload fills their extent to exactly 64 KiB.
  constexpr uint64_t block_extent = 64 * 1024;
  constexpr uint64_t block_payload = block_extent - shm::payload_offset_for(64);
  static_assert(shm::extent_bytes_for(64, block_payload) == block_extent);
  constexpr uint64_t cap = 4 * block_extent;
  start({.reservation_bytes_max = cap});
  ClientPtr c = connect(make_ns(0xb17e5, 64, block_payload));
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> tokens = make_tokens(9, 5 * 64);
  kvpark_publish_options options{.session_id = 1};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, 4, &r),
            KVPARK_OK);
  EXPECT_EQ(observer_.stats().arena_free_bytes, baseline_.arena_free_bytes - cap);
  ASSERT_EQ(kvpark_abort(r), KVPARK_OK);
  EXPECT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, 5, &r),
            KVPARK_LIMIT_EXCEEDED);
  // Snapshots: an extent of exactly the cap, then one granule more.
  const std::vector<int32_t> tail = make_tokens(10, 10);
  const uint64_t payload = cap - shm::payload_offset_for(10);
  ASSERT_EQ(kvpark_reserve_snapshot(c.get(), &options, tail.data(), tail.size(), payload, &r),
            KVPARK_OK);
  ASSERT_EQ(kvpark_abort(r), KVPARK_OK);
  EXPECT_EQ(kvpark_reserve_snapshot(c.get(), &options, tail.data(), tail.size(), payload + 1, &r),
            KVPARK_LIMIT_EXCEEDED);
  c.reset();
  observer_.expect_back_to(baseline_);
}

TEST_F(Limits, ReservationsPerConnectionAtCapAndCapPlusOne) {
  start();
  ClientPtr c = connect(make_ns(0x5e5e, 16, 3584));
  ASSERT_NE(c, nullptr);
  kvpark_publish_options options{.session_id = 1};
  std::vector<kvpark_reservation*> held;
  for (size_t i = 0; i < limits::reservations_per_connection_max; ++i) {
    const int32_t token = static_cast<int32_t>(i);
    kvpark_reservation* r = nullptr;
    ASSERT_EQ(kvpark_reserve_snapshot(c.get(), &options, &token, 1, 100, &r), KVPARK_OK) << i;
    held.push_back(r);
  }
  EXPECT_EQ(observer_.stats().reservations,
            baseline_.reservations + limits::reservations_per_connection_max);
  const int32_t next = 100000;
  kvpark_reservation* r = nullptr;
  EXPECT_EQ(kvpark_reserve_snapshot(c.get(), &options, &next, 1, 100, &r), KVPARK_LIMIT_EXCEEDED);
  const std::vector<int32_t> tokens = make_tokens(3, 32);
  EXPECT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, 1, &r),
            KVPARK_LIMIT_EXCEEDED);
  ASSERT_EQ(kvpark_abort(held.back()), KVPARK_OK);
  held.pop_back();
  ASSERT_EQ(kvpark_reserve_snapshot(c.get(), &options, &next, 1, 100, &r), KVPARK_OK);
  held.push_back(r);
  for (kvpark_reservation* h : held) ASSERT_EQ(kvpark_abort(h), KVPARK_OK);
  c.reset();
  observer_.expect_back_to(baseline_);
}

TEST_F(Limits, BlocksPerReserveAtCapAndCapPlusOne) {
  start();
  // Small blocks: reserve_blocks_max of them fit the default reservation cap.
  const kvpark_namespace ns = make_ns(0xb10c5, 16, 3584);
  ClientPtr c = connect(ns);
  ASSERT_NE(c, nullptr);
  const size_t cap = limits::reserve_blocks_max;
  const std::vector<int32_t> tokens = make_tokens(11, (cap + 1) * 16);
  kvpark_publish_options options{.session_id = 1};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, cap, &r),
            KVPARK_OK);
  EXPECT_EQ(kvpark_reservation_block_count(r), cap);
  ASSERT_EQ(kvpark_abort(r), KVPARK_OK);
  EXPECT_EQ(kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, cap + 1, &r),
            KVPARK_LIMIT_EXCEEDED);

  // On the wire: cap hashes are a request, cap + 1 a protocol error.
  RawClient raw(daemon_->socket_path());
  ASSERT_EQ(raw.hello({ns.id.low, ns.id.high}, {.block_tokens = 16, .block_payload_bytes = 3584}),
            Status::Ok);
  wire::ReserveBlocksRequest req;
  req.chunk_hashes.resize(cap);
  for (size_t i = 0; i < cap; ++i) req.chunk_hashes[i] = {i + 1, 0xabc};
  std::vector<uint8_t> frame, body;
  wire::encode(req, 2, frame);
  wire::FrameHeader h;
  ASSERT_TRUE(raw.call(frame, h, body));
  EXPECT_EQ(h.status, 0);
  EXPECT_EQ(observer_.stats().reservations, baseline_.reservations + 1);
  req.chunk_hashes.push_back({cap + 1, 0xabc});
  frame.clear();
  wire::encode(req, 3, frame);
  ASSERT_TRUE(raw.send(frame));
  EXPECT_TRUE(raw.wait_for_eof());
  expected_errors_ = 1;
  EXPECT_EQ(observer_.stats().protocol_errors, baseline_.protocol_errors + 1);
  c.reset();
  observer_.expect_back_to(baseline_);  // the dropped peer's reservation was aborted
}

TEST_F(Limits, LookupTokensAtCapAndCapPlusOne) {
  start();
  // 128-token chunks: lookup_tokens_max tokens are exactly lookup_chunks_max chunks.
  static_assert(limits::lookup_tokens_max / 128 == limits::lookup_chunks_max);
  ClientPtr c = connect(make_ns(0x70ce, 128, 3584));
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> tokens = make_tokens(12, limits::lookup_tokens_max + 1);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), limits::lookup_tokens_max, &plan), KVPARK_OK);
  kvpark_plan_release(plan);
  EXPECT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), limits::lookup_tokens_max + 1, &plan),
            KVPARK_LIMIT_EXCEEDED);
}

TEST_F(Limits, LookupChunksAtCapAndCapPlusOne) {
  start();
  // 64-token chunks: the chunk cap binds before the token cap.
  ClientPtr c = connect(make_ns(0xc4a, 64, 3584));
  ASSERT_NE(c, nullptr);
  const size_t at_cap = limits::lookup_chunks_max * 64;
  const std::vector<int32_t> tokens = make_tokens(13, at_cap + 64);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), at_cap, &plan), KVPARK_OK);
  kvpark_plan_release(plan);
  ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), at_cap + 63, &plan), KVPARK_OK)
      << "a partial chunk is a tail, not a chunk";
  kvpark_plan_release(plan);
  EXPECT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), at_cap + 64, &plan), KVPARK_LIMIT_EXCEEDED);
}

TEST_F(Limits, DaemonEnforcesLookupCapsOnTheWire) {
  start();
  RawClient raw(daemon_->socket_path());
  ASSERT_EQ(raw.hello({0x3a3, 1}, {.block_tokens = 128, .block_payload_bytes = 3584}), Status::Ok);
  wire::LookupRequest req;
  req.chunk_hashes.resize(limits::lookup_chunks_max);
  for (size_t i = 0; i < req.chunk_hashes.size(); ++i) req.chunk_hashes[i] = {i + 1, 3};
  req.prompt_tokens = limits::lookup_tokens_max;
  std::vector<uint8_t> frame, body;
  wire::encode(req, 2, frame);
  wire::FrameHeader h;
  ASSERT_TRUE(raw.call(frame, h, body));
  EXPECT_EQ(h.status, 0) << "N tokens in N/128 chunks";
  // One tail token more: over lookup_tokens_max.
  req.tail_tokens = {1};
  req.prompt_tokens = limits::lookup_tokens_max + 1;
  frame.clear();
  wire::encode(req, 3, frame);
  ASSERT_TRUE(raw.call(frame, h, body));
  EXPECT_EQ(h.status, static_cast<uint16_t>(Status::LimitExceeded));
  // One chunk more than lookup_chunks_max does not even decode.
  req.tail_tokens.clear();
  req.chunk_hashes.push_back({0, 0});
  req.prompt_tokens = 0;
  frame.clear();
  wire::encode(req, 4, frame);
  ASSERT_TRUE(raw.send(frame));
  EXPECT_TRUE(raw.wait_for_eof());
  expected_errors_ = 1;
  observer_.expect_back_to(baseline_);
}

TEST_F(Limits, PeerThatNeverReadsRepliesDoesNotStallOthers) {
  start();
  RawClient slow(daemon_->socket_path());
  ASSERT_TRUE(slow.connected());
  std::vector<uint8_t> stats_frame;
  wire::encode(static_cast<uint16_t>(wire::Verb::Stats), 0, 1, stats_frame);
  // Queue requests until the socket pushes back, never reading a reply.
  constexpr int requests_max = 20000;
  int sent = 0;
  while (sent < requests_max && slow.send(stats_frame, -1, /*dontwait=*/true)) ++sent;
  ASSERT_GT(sent, 10);
  // The daemon's replies to `slow` have nowhere to go; everyone else is served.
  // A daemon stalled on `slow` would stay stalled while `slow` never reads, so any
  // bound shows it; a generous one, since a loaded machine is slow, not stalled.
  for (int i = 0; i < 20; ++i) {
    const uint64_t start_msec = monotonic_msec();
    observer_.publish_and_verify();
    EXPECT_LT(monotonic_msec() - start_msec, uint64_t{wait_timeout_msec_default}) << "round " << i;
  }
  ClientPtr other = connect(make_ns(0x510, 16, 3584));
  EXPECT_NE(other, nullptr) << "new connections are accepted meanwhile";
  // When the slow peer finally reads, every request has its reply, in order.
  int replies = 0;
  std::vector<uint8_t> reply;
  while (replies < sent && slow.receive(reply, 5000) == Received::Message) {
    wire::FrameHeader h;
    std::span<const uint8_t> body;
    ASSERT_EQ(wire::decode_header(reply, h, body), Status::Ok);
    ASSERT_EQ(h.verb, static_cast<uint16_t>(wire::Verb::Stats) | wire::reply_bit);
    ++replies;
  }
  EXPECT_EQ(replies, sent);
  other.reset();
  slow.close();
  observer_.expect_back_to(baseline_);
}

// A full namespace table takes a new namespace only in the place of one that holds no
// entry and that no connection names; every other namespace keeps its entries.
TEST_F(Limits, NamespacesAtCapAndCapPlusOne) {
  start();
  // The observer registered one namespace (and stays connected); engines bring the table
  // to the cap, each parking one block, except `idle`, which parks nothing.
  ASSERT_EQ(observer_.stats().namespaces, 1u);
  const uint32_t block_tokens = 16;
  const uint64_t block_bytes = 3584;
  const uint64_t idle = 0xa000 + 500;
  const std::vector<int32_t> tokens = make_tokens(9, block_tokens + 1);
  const kvpark_publish_options options{.session_id = 1};
  auto park_one = [&](kvpark_client* c) {
    kvpark_reservation* r = nullptr;
    ASSERT_EQ(kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, 1, &r),
              KVPARK_OK);
    ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
  };
  auto restorable = [&](kvpark_client* c) {
    kvpark_plan* plan = nullptr;
    EXPECT_EQ(kvpark_lookup(c, 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
    const uint32_t n = plan != nullptr ? kvpark_plan_restorable_tokens(plan) : 0;
    if (plan != nullptr) kvpark_plan_release(plan);
    return n;
  };
  ClientPtr idle_client;
  for (uint64_t i = 1; i < limits::namespaces_max; ++i) {
    ClientPtr c = connect(make_ns(0xa000 + i, block_tokens, block_bytes));
    ASSERT_NE(c, nullptr) << i;
    if (0xa000 + i == idle) {
      idle_client = std::move(c);
    } else {
      park_one(c.get());
    }
  }
  EXPECT_EQ(observer_.stats().namespaces, limits::namespaces_max);
  // Full, every namespace holding entries or named by a connection: refused.
  const kvpark_namespace fresh =
      make_ns(0xa000 + limits::namespaces_max, block_tokens, block_bytes);
  EXPECT_EQ(connect(fresh, KVPARK_LIMIT_EXCEEDED), nullptr);
  // A namespace the daemon knows is not a new one: it still connects, and serves.
  ClientPtr known = connect(make_ns(0xa001, block_tokens, block_bytes));
  ASSERT_NE(known, nullptr);
  EXPECT_EQ(restorable(known.get()), block_tokens);
  known.reset();
  // The idle namespace's last connection goes: the fresh one takes its place.
  idle_client.reset();
  ClientPtr taken = connect(fresh);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(observer_.stats().namespaces, limits::namespaces_max);
  EXPECT_EQ(restorable(taken.get()), 0u) << "a reused index brings no entries with it";
  park_one(taken.get());
  EXPECT_EQ(restorable(taken.get()), block_tokens);
  // The idle namespace is forgotten: it is a new one now, and there is no room for it.
  EXPECT_EQ(connect(make_ns(idle, block_tokens, block_bytes), KVPARK_LIMIT_EXCEEDED), nullptr);
  // Every namespace that held a block still finds it.
  for (uint64_t i : {uint64_t{1}, uint64_t{499}, uint64_t{501}, limits::namespaces_max - 1}) {
    ClientPtr c = connect(make_ns(0xa000 + i, block_tokens, block_bytes));
    ASSERT_NE(c, nullptr) << i;
    EXPECT_EQ(restorable(c.get()), block_tokens) << i;
  }
  kvpark_stats settled = observer_.stats();  // the parked blocks stay
  settled.connections = baseline_.connections;
  taken.reset();
  observer_.expect_back_to(settled);
}

}  // namespace
}  // namespace kvpark::testing
