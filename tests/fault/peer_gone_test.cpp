// Peers that go away or overreach while the daemon owes them replies, against a real
// kvparkd: a WAIT answered from inside another request (the peer's own ABORT or SEAL
// settles the lease it waits on) finds the peer unable to read. That connection
// closes, only after the request in hand is done; the daemon stays up and serves
// everyone else. A peer that pipelines WAITs is held to its share of the slots.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <span>
#include <vector>

#include "proto/limits.h"
#include "proto/wire.h"
#include "tests/fault/observer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_client.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

using Received = RawClient::Received;

constexpr NamespaceId raw_ns{0x9e7, 0x90e};
constexpr Geometry raw_geometry{.block_tokens = 16, .block_payload_bytes = 3584};
constexpr uint32_t wait_msec = 10'000;  // cut to nothing by the prefill rate below

class PeerGone : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
    ASSERT_TRUE(daemon_.start()) << "kvparkd did not start; log: " << daemon_.log_path();
    ASSERT_EQ(observer_.connect(daemon_.socket_path()), KVPARK_OK);
    observer_.publish_and_verify();
    baseline_ = observer_.stats();
  }

  void TearDown() override {
    if (!daemon_.running()) return;
    observer_.expect_back_to(baseline_);  // the daemon has seen every peer's EOF
    EXPECT_EQ(daemon_.stop(), 0) << "kvparkd must exit cleanly on SIGTERM";
  }

  // HELLO for raw_ns, whose engines say they prefill faster than anything: a WAIT on
  // a block another engine has in flight is due at once (single_flight.h), and is
  // answered by the next event that answers waiters.
  static Status hello_fast(RawClient& raw) {
    return raw.hello(raw_ns, raw_geometry, UINT32_MAX);
  }

  // Reserves the block `hash` on `raw`; the reservation's id.
  static uint64_t reserve(RawClient& raw, const Hash128& hash) {
    wire::ReserveBlocksRequest req;
    req.parent_hash = raw_ns;
    req.chunk_hashes = {hash};
    std::vector<uint8_t> frame, body;
    wire::encode(req, 2, frame);
    wire::FrameHeader h;
    EXPECT_TRUE(raw.call(frame, h, body));
    EXPECT_EQ(h.status, 0);
    wire::ReserveBlocksReply rep;
    EXPECT_EQ(wire::decode(body, rep), Status::Ok);
    EXPECT_NE(rep.reservation_id, 0u);
    return rep.reservation_id;
  }

  // Leases the block `hash`, which another connection has in flight; the lease's id.
  static uint64_t lease_in_flight(RawClient& raw, const Hash128& hash) {
    wire::LookupRequest req;  // the block and one more: the last token is always computed
    req.prompt_tokens = 2 * raw_geometry.block_tokens;
    req.chunk_hashes = {hash, {0xee, 0xee}};
    std::vector<uint8_t> frame, body;
    wire::encode(req, 3, frame);
    wire::FrameHeader h;
    EXPECT_TRUE(raw.call(frame, h, body));
    EXPECT_EQ(h.status, 0);
    wire::LookupReply rep;
    EXPECT_EQ(wire::decode(body, rep), Status::Ok);
    EXPECT_NE(rep.lease_id, 0u) << "the in-flight block is leased to wait on";
    EXPECT_EQ(rep.inflight_tokens, raw_geometry.block_tokens);
    return rep.lease_id;
  }

  DaemonProcess daemon_;
  Observer observer_;
  kvpark_stats baseline_{};
};

TEST_F(PeerGone, SettlingItsOwnReservationAfterItStoppedReadingClosesOnlyItsConnection) {
  RawClient leader(daemon_.socket_path());
  ASSERT_EQ(hello_fast(leader), Status::Ok);
  const Hash128 in_flight{0x1f1, 0x77};
  (void)reserve(leader, in_flight);
  for (const wire::Verb verb : {wire::Verb::Abort, wire::Verb::Seal}) {
    SCOPED_TRACE(verb == wire::Verb::Abort ? "ABORT" : "SEAL");
    RawClient follower(daemon_.socket_path());
    ASSERT_EQ(hello_fast(follower), Status::Ok);
    const uint64_t own = reserve(follower, {0x2000u + static_cast<uint64_t>(verb), 0x77});
    const uint64_t lease = lease_in_flight(follower, in_flight);
    // The WAIT (due at once), then the peer reads nothing more, then it settles its own
    // reservation: answering that answers the WAIT too, whose reply fails with EPIPE.
    std::vector<uint8_t> wait, settle;
    wire::encode(wire::WaitRequest{.lease_id = lease, .timeout_msec = wait_msec}, 4, wait);
    wire::ReservationRequest req{.reservation_id = own};
    if (verb == wire::Verb::Seal) req.payload_checksums = {0};
    wire::encode(verb, req, 5, settle);
    ASSERT_TRUE(follower.send(wait));
    ASSERT_EQ(::shutdown(follower.fd(), SHUT_RD), 0);
    ASSERT_TRUE(follower.send(settle));
    // The daemon closes this connection, and nothing else.
    EXPECT_TRUE(follower.wait_for_eof()) << "the connection must close";
    observer_.publish_and_verify();
    ASSERT_EQ(RawClient(daemon_.socket_path()).hello(raw_ns, raw_geometry), Status::Ok)
        << "kvparkd must keep serving; log: " << daemon_.log_tail();
  }
  leader.close();  // its reservation is aborted
  // The SEAL took effect; only its reply was lost. Nothing else changed.
  EXPECT_TRUE(wait_until([&] { return observer_.stats().blocks == baseline_.blocks + 1; }));
  baseline_ = observer_.stats();
}

// A peer that pipelines WAITs (libkvpark sends one request at a time per client) gets
// LIMIT_EXCEEDED past its own share; the pending-WAIT slots stay open to everyone else,
// whose WAIT is queued and answered when the leader seals.
TEST_F(PeerGone, PipelinedWaitsOfOneConnectionLeaveWaitSlotsForOthers) {
  constexpr NamespaceId slow_ns{0x51e, 0x90e};  // prefill rate 0: WAITs run their course
  const Hash128 in_flight{0x3f1, 0x77};
  RawClient leader(daemon_.socket_path());
  ASSERT_EQ(leader.hello(slow_ns, raw_geometry), Status::Ok);
  wire::ReserveBlocksRequest reserve_req;
  reserve_req.parent_hash = slow_ns;
  reserve_req.chunk_hashes = {in_flight};
  std::vector<uint8_t> frame, body;
  wire::FrameHeader h;
  wire::encode(reserve_req, 2, frame);
  ASSERT_TRUE(leader.call(frame, h, body));
  ASSERT_EQ(h.status, 0);
  wire::ReserveBlocksReply reserved;
  ASSERT_EQ(wire::decode(body, reserved), Status::Ok);

  RawClient hog(daemon_.socket_path());
  ASSERT_EQ(hog.hello(slow_ns, raw_geometry), Status::Ok);
  const uint64_t hog_lease = lease_in_flight(hog, in_flight);
  // Its share is queued (no reply yet); every WAIT past it, as many as would fill every
  // slot, is refused at once.
  for (uint32_t i = 0; i < limits::waits_max; ++i) {
    frame.clear();
    wire::encode(
        wire::WaitRequest{.lease_id = hog_lease, .timeout_msec = limits::wait_timeout_msec_max},
        100 + i, frame);
    ASSERT_TRUE(hog.send(frame)) << "WAIT " << i;
    if (i < limits::waits_per_connection_max) continue;
    std::vector<uint8_t> reply;
    ASSERT_EQ(hog.receive(reply), Received::Message) << "WAIT " << i;
    std::span<const uint8_t> reply_body;
    ASSERT_EQ(wire::decode_header(reply, h, reply_body), Status::Ok);
    ASSERT_EQ(h.sequence, 100 + i);
    ASSERT_EQ(h.status, static_cast<uint16_t>(Status::LimitExceeded)) << "WAIT " << i;
  }

  RawClient follower(daemon_.socket_path());
  ASSERT_EQ(follower.hello(slow_ns, raw_geometry), Status::Ok);
  const uint64_t lease = lease_in_flight(follower, in_flight);
  frame.clear();
  wire::encode(wire::WaitRequest{.lease_id = lease, .timeout_msec = limits::wait_timeout_msec_max},
               4, frame);
  ASSERT_TRUE(follower.send(frame));
  frame.clear();
  wire::encode(
      wire::Verb::Seal,
      wire::ReservationRequest{.reservation_id = reserved.reservation_id, .payload_checksums = {0}},
      3, frame);
  ASSERT_TRUE(leader.call(frame, h, body));
  ASSERT_EQ(h.status, 0);
  // Queued, not refused: its answer comes with the seal (settled: look up again).
  std::vector<uint8_t> reply;
  ASSERT_EQ(follower.receive(reply), Received::Message);
  std::span<const uint8_t> reply_body;
  ASSERT_EQ(wire::decode_header(reply, h, reply_body), Status::Ok);
  EXPECT_EQ(h.sequence, 4u);
  EXPECT_EQ(h.status, 0) << status_name(static_cast<Status>(h.status));
  hog.close();
  follower.close();
  leader.close();
  EXPECT_TRUE(wait_until([&] { return observer_.stats().blocks == baseline_.blocks + 1; }));
  baseline_ = observer_.stats();
}

}  // namespace
}  // namespace kvpark::testing
