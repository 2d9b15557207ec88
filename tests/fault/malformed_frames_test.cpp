// Malformed frames against a real kvparkd: each one closes that connection only
// (the peer reads EOF), counts a protocol error, leaks nothing, and a
// well-behaved engine keeps publishing and restoring meanwhile.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "proto/limits.h"
#include "proto/wire.h"
#include "tests/fault/observer.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_client.h"

namespace kvpark::testing {
namespace {

using Received = RawClient::Received;

constexpr NamespaceId raw_ns{0x4a3, 0x77};
constexpr Geometry raw_geometry{.block_tokens = 16, .block_payload_bytes = 3584};

std::vector<uint8_t> stats_request(uint16_t verb = static_cast<uint16_t>(wire::Verb::Stats),
                                   uint16_t status = 0) {
  std::vector<uint8_t> m;
  wire::encode(verb, status, 1, m);
  return m;
}

void set_body_bytes(std::vector<uint8_t>& m, uint32_t body_bytes) {
  std::memcpy(m.data() + 8, &body_bytes, 4);
}

class MalformedFrames : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
    ASSERT_TRUE(daemon_.start()) << "kvparkd did not start; log: " << daemon_.log_path();
    ASSERT_EQ(observer_.connect(daemon_.socket_path()), KVPARK_OK);
    observer_.publish_and_verify();
    baseline_ = observer_.stats();
    baseline_fds_ = count_open_fds(daemon_.pid());
    ASSERT_GT(baseline_fds_, 0);
  }

  // Sends `message` on a fresh connection (after HELLO when `greet`) and expects
  // the daemon to drop it, count one protocol error, and keep serving.
  void expect_dropped(const std::vector<uint8_t>& message, bool greet = false, int pass_fd = -1) {
    const uint64_t errors_before = observer_.stats().protocol_errors;
    RawClient raw(daemon_.socket_path());
    ASSERT_TRUE(raw.connected());
    if (greet) {
      ASSERT_EQ(raw.hello(raw_ns, raw_geometry), Status::Ok);
    }
    ASSERT_TRUE(raw.send(message, pass_fd)) << strerror(errno);
    std::vector<uint8_t> reply;
    EXPECT_EQ(raw.receive(reply), Received::Eof) << "the daemon must close, not answer";
    EXPECT_EQ(observer_.stats().protocol_errors, errors_before + 1);
    observer_.publish_and_verify();
    observer_.expect_back_to(baseline_);
  }

  void TearDown() override {
    if (!daemon_.running()) return;
    observer_.expect_back_to(baseline_);  // the daemon has seen every peer's EOF
    EXPECT_EQ(count_open_fds(daemon_.pid()), baseline_fds_) << "the daemon leaked descriptors";
    EXPECT_EQ(daemon_.stop(), 0) << "kvparkd must exit cleanly on SIGTERM";
  }

  DaemonProcess daemon_;
  Observer observer_;
  kvpark_stats baseline_{};
  int baseline_fds_ = 0;
};

TEST_F(MalformedFrames, DropsTruncatedHeader) {
  const std::vector<uint8_t> full = stats_request();
  for (size_t n : {size_t{1}, size_t{8}, wire::frame_header_bytes - 1}) {
    expect_dropped({full.begin(), full.begin() + n});
  }
}

TEST_F(MalformedFrames, DropsOversizedMessage) {
  // One byte over the cap, with a header that is honest about it.
  std::vector<uint8_t> m = stats_request();
  m.resize(limits::frame_bytes_max + 1);
  set_body_bytes(m, static_cast<uint32_t>(m.size() - wire::frame_header_bytes));
  expect_dropped(m);
  // Larger than the daemon's receive buffer: the kernel truncates it.
  m.resize(limits::frame_bytes_max + 4096);
  set_body_bytes(m, static_cast<uint32_t>(m.size() - wire::frame_header_bytes));
  expect_dropped(m);
}

TEST_F(MalformedFrames, DropsUnknownVerb) {
  for (uint16_t verb : {uint16_t{0}, uint16_t{wire::verb_max + 1}, uint16_t{0x7fff}}) {
    expect_dropped(stats_request(verb));
  }
}

TEST_F(MalformedFrames, DropsReplyBitInRequest) {
  expect_dropped(stats_request(static_cast<uint16_t>(wire::Verb::Stats) | wire::reply_bit));
  std::vector<uint8_t> m;
  wire::encode(wire::HelloReply{}, 1, m);
  expect_dropped(m);
}

TEST_F(MalformedFrames, DropsRequestCarryingAStatus) {
  expect_dropped(stats_request(static_cast<uint16_t>(wire::Verb::Stats), 1));
}

TEST_F(MalformedFrames, DropsNonzeroReserved) {
  std::vector<uint8_t> m = stats_request();
  m[15] = 1;
  expect_dropped(m);
}

TEST_F(MalformedFrames, DropsLyingBodyLength) {
  std::vector<uint8_t> m;
  wire::encode(wire::ReleaseRequest{1}, 1, m);
  std::vector<uint8_t> longer = m, shorter = m;
  set_body_bytes(longer, 9);
  set_body_bytes(shorter, 7);
  expect_dropped(longer, true);
  expect_dropped(shorter, true);
}

TEST_F(MalformedFrames, DropsCountsThatLie) {
  wire::LookupRequest lookup;
  lookup.prompt_tokens = 2 * 16 + 1;
  lookup.chunk_hashes = {{1, 1}, {2, 2}};
  lookup.tail_tokens = {3};
  std::vector<uint8_t> m;
  wire::encode(lookup, 1, m);
  for (uint32_t chunks : {1u, 3u, 0xffffffffu}) {
    std::vector<uint8_t> bad = m;
    std::memcpy(bad.data() + wire::frame_header_bytes + 12, &chunks, 4);
    expect_dropped(bad, true);
  }
  wire::ReserveBlocksRequest reserve;
  reserve.chunk_hashes = {{1, 1}, {2, 2}};
  m.clear();
  wire::encode(reserve, 1, m);
  const uint32_t one = 1;
  // options 12 bytes, first_chunk u32, parent hash 16 bytes, count u32 @32.
  std::memcpy(m.data() + wire::frame_header_bytes + 32, &one, 4);
  expect_dropped(m, true);
}

TEST_F(MalformedFrames, DropsBodyThatDoesNotDecode) {
  std::vector<uint8_t> m = stats_request();
  m.push_back(0);
  set_body_bytes(m, 1);
  expect_dropped(m);  // STATS has no body
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = raw_ns;
  hello.geometry = raw_geometry;
  m.clear();
  wire::encode(hello, 1, m);
  m[wire::frame_header_bytes + 2] = 4;  // unknown HELLO flag (bits 0 and 1 exist)
  expect_dropped(m);
}

TEST_F(MalformedFrames, DropsPassedFileDescriptor) {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  expect_dropped(stats_request(), false, fd);
  close(fd);
}

TEST_F(MalformedFrames, DropsGarbageAfterAnOpenReservationAndFreesIt) {
  const uint64_t errors_before = observer_.stats().protocol_errors;
  RawClient raw(daemon_.socket_path());
  ASSERT_EQ(raw.hello(raw_ns, raw_geometry), Status::Ok);
  wire::ReserveBlocksRequest reserve;
  reserve.chunk_hashes = {{11, 1}, {12, 2}, {13, 3}};
  std::vector<uint8_t> frame, body;
  wire::encode(reserve, 2, frame);
  wire::FrameHeader h;
  ASSERT_TRUE(raw.call(frame, h, body));
  ASSERT_EQ(h.status, 0);
  EXPECT_EQ(observer_.stats().reservations, baseline_.reservations + 1);
  EXPECT_LT(observer_.stats().arena_free_bytes, baseline_.arena_free_bytes);
  ASSERT_TRUE(raw.send({0xde, 0xad}));
  EXPECT_TRUE(raw.wait_for_eof());
  EXPECT_EQ(observer_.stats().protocol_errors, errors_before + 1);
  observer_.expect_back_to(baseline_);
}

// Documented in proto/status.h: a well-formed verb sent at the wrong time is
// answered with BadState, and the connection stays usable.
TEST_F(MalformedFrames, FrameBeforeHelloIsAnsweredBadState) {
  RawClient raw(daemon_.socket_path());
  wire::LookupRequest lookup;
  lookup.prompt_tokens = 1;
  lookup.tail_tokens = {1};
  std::vector<uint8_t> frame, body;
  wire::encode(lookup, 5, frame);
  wire::FrameHeader h;
  ASSERT_TRUE(raw.call(frame, h, body));
  EXPECT_EQ(h.status, static_cast<uint16_t>(Status::BadState));
  EXPECT_EQ(h.sequence, 5u);
  EXPECT_EQ(h.verb, static_cast<uint16_t>(wire::Verb::Lookup) | wire::reply_bit);
  EXPECT_EQ(raw.hello(raw_ns, raw_geometry), Status::Ok) << "the connection is still usable";
  EXPECT_EQ(observer_.stats().protocol_errors, baseline_.protocol_errors);
}

TEST_F(MalformedFrames, SecondHelloIsAnsweredBadState) {
  RawClient raw(daemon_.socket_path());
  ASSERT_EQ(raw.hello(raw_ns, raw_geometry), Status::Ok);
  EXPECT_EQ(raw.hello(raw_ns, raw_geometry), Status::BadState);
  EXPECT_EQ(raw.hello({9, 9}, raw_geometry), Status::BadState);
  EXPECT_EQ(observer_.stats().protocol_errors, baseline_.protocol_errors);
  raw.close();
  observer_.expect_back_to(baseline_);
}

TEST_F(MalformedFrames, ManyMalformedConnectionsLeaveFdCountFlat) {
  const uint64_t errors_before = observer_.stats().protocol_errors;
  constexpr int connections = 500;
  for (int i = 0; i < connections; ++i) {
    RawClient raw(daemon_.socket_path());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.send({uint8_t(i), 0xff, 0xff}));
    ASSERT_TRUE(raw.wait_for_eof()) << i;
  }
  EXPECT_EQ(observer_.stats().protocol_errors, errors_before + connections);
  observer_.expect_back_to(baseline_);
  EXPECT_EQ(count_open_fds(daemon_.pid()), baseline_fds_);
  observer_.publish_and_verify();
}

// Seeded random frames: pure noise, valid frames with flipped bytes, truncations,
// trailing junk, and valid requests with random fields.
class FrameFactory {
 public:
  explicit FrameFactory(uint64_t seed) : rng_(seed) {}

  std::vector<uint8_t> next() {
    std::vector<uint8_t> m = valid_request();
    switch (rng_() % 6) {
      case 0: {  // noise
        m.resize(1 + rng_() % 64);
        for (auto& b : m) b = uint8_t(rng_());
        break;
      }
      case 1: {  // an honest header over a random body
        m.resize(wire::frame_header_bytes + rng_() % 64);
        for (size_t i = wire::frame_header_bytes; i < m.size(); ++i) m[i] = uint8_t(rng_());
        set_body_bytes(m, static_cast<uint32_t>(m.size() - wire::frame_header_bytes));
        break;
      }
      case 2: {  // flipped bytes
        const int flips = 1 + int(rng_() % 3);
        for (int i = 0; i < flips; ++i) m[rng_() % m.size()] ^= uint8_t(1 + rng_() % 255);
        break;
      }
      case 3:  // truncated
        m.resize(1 + rng_() % (m.size() - 1));  // valid requests are >= 16 bytes
        break;
      case 4: {  // trailing junk
        const size_t extra = 1 + rng_() % 8;
        for (size_t i = 0; i < extra; ++i) m.push_back(uint8_t(rng_()));
        break;
      }
      default:  // as is
        break;
    }
    return m;
  }

 private:
  Hash128 hash() { return {rng_(), rng_()}; }
  std::vector<uint8_t> valid_request() {
    std::vector<uint8_t> m;
    const uint32_t seq = uint32_t(rng_());
    switch (rng_() % 8) {
      case 0: {
        wire::HelloRequest r;
        r.protocol_version = rng_() % 8 ? limits::protocol_version : uint16_t(rng_());
        r.namespace_id = rng_() % 2 ? raw_ns : hash();
        r.geometry = rng_() % 2 ? raw_geometry
                                : Geometry{.block_tokens = uint32_t(rng_() % 80),
                                           .block_payload_bytes = rng_() % 8192,
                                           .snapshot_required = rng_() % 2 == 0};
        r.client_name.assign(rng_() % 10, 'r');
        wire::encode(r, seq, m);
        break;
      }
      case 1: {
        wire::LookupRequest r;
        r.session_id = rng_();
        r.chunk_hashes.resize(rng_() % 5);
        for (auto& h : r.chunk_hashes) h = hash();
        r.tail_tokens.resize(rng_() % 20);
        for (auto& t : r.tail_tokens) t = int32_t(rng_());
        r.prompt_tokens = rng_() % 4 ? uint32_t(r.chunk_hashes.size() * 16 + r.tail_tokens.size())
                                     : uint32_t(rng_());
        wire::encode(r, seq, m);
        break;
      }
      case 2:
        wire::encode(wire::ReleaseRequest{rng_() | (1ull << 40)}, seq, m);
        break;
      case 3: {
        wire::ReserveBlocksRequest r;
        r.options = {.session_id = rng_(), .entry_class = uint8_t(rng_() % 2),
                     .evidence = uint8_t(rng_() % 5)};
        r.first_chunk = uint32_t(rng_() % 4);
        r.chunk_hashes.resize(1 + rng_() % 4);
        for (auto& h : r.chunk_hashes) h = hash();
        wire::encode(r, seq, m);
        break;
      }
      case 4: {
        wire::ReserveSnapshotRequest r;
        r.options.session_id = rng_();
        r.anchor_chunks = uint32_t(rng_() % 3);
        r.anchor_hash = r.anchor_chunks == 0 ? raw_ns : hash();
        r.payload_bytes = rng_() % (1 << 20);
        r.tail_tokens.resize(rng_() % 20);
        wire::encode(r, seq, m);
        break;
      }
      case 5:
        wire::encode(wire::Verb::Seal, wire::ReservationRequest{.reservation_id = rng_() | (1ull << 40)}, seq, m);
        break;
      case 6:
        wire::encode(wire::Verb::Abort, wire::ReservationRequest{.reservation_id = rng_() | (1ull << 40)}, seq, m);
        break;
      default:
        wire::encode(static_cast<uint16_t>(wire::Verb::Stats), 0, seq, m);
        break;
    }
    return m;
  }

  std::mt19937_64 rng_;
};

TEST_F(MalformedFrames, SeededRandomFramesNeverCrashStallOrLeak) {
  constexpr int frames_total = 3000;
  constexpr int frames_per_connection_max = 8;
  FrameFactory factory(20240601);
  const uint64_t errors_before = observer_.stats().protocol_errors;
  uint64_t drops = 0, replies = 0;
  int sent = 0;
  while (sent < frames_total) {
    RawClient raw(daemon_.socket_path());
    ASSERT_TRUE(raw.connected());
    for (int i = 0; i < frames_per_connection_max && sent < frames_total; ++i) {
      const std::vector<uint8_t> frame = factory.next();
      ++sent;
      ASSERT_TRUE(raw.send(frame)) << "frame " << sent << ": " << strerror(errno);
      std::vector<uint8_t> reply;
      const Received r = raw.receive(reply);
      ASSERT_NE(r, Received::Timeout) << "frame " << sent << " got neither a reply nor EOF";
      ASSERT_NE(r, Received::Error) << "frame " << sent;
      if (r == Received::Eof) {
        ++drops;
        break;
      }
      ++replies;
      wire::FrameHeader h;
      std::span<const uint8_t> body;
      ASSERT_EQ(wire::decode_header(reply, h, body), Status::Ok) << "frame " << sent;
      ASSERT_NE(h.verb & wire::reply_bit, 0) << "frame " << sent;
    }
    if (sent % 500 < frames_per_connection_max) observer_.publish_and_verify();
  }
  EXPECT_GT(drops, uint64_t{frames_total / 4}) << "the generator should mostly produce garbage";
  EXPECT_GT(replies, 0u) << "and some valid requests";
  EXPECT_EQ(observer_.stats().protocol_errors, errors_before + drops);
  observer_.publish_and_verify();
  observer_.expect_back_to(baseline_);
  EXPECT_EQ(count_open_fds(daemon_.pid()), baseline_fds_);
}

}  // namespace
}  // namespace kvpark::testing
