// The frame codec: every message round-trips, and the strict decoders reject
// truncation, trailing bytes, lying lengths and counts, counts over their caps,
// unknown verbs and statuses, nonzero reserved fields and out-of-range enums.
#include "proto/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "proto/limits.h"

namespace kvpark::wire {
namespace {

// One encoded message and a way to decode its body into a fresh value.
struct Sample {
  const char* name;
  std::vector<uint8_t> message;
  std::function<Status(std::span<const uint8_t>)> decode_body;
};

HelloRequest sample_hello_request() {
  HelloRequest m;
  m.protocol_version = limits::protocol_version;
  m.namespace_id = {0x1122334455667788ull, 0x99aabbccddeeff00ull};
  m.geometry = {.block_tokens = 64, .block_payload_bytes = 65536, .snapshot_required = true};
  m.prefill_tokens_per_second = 4000;
  m.client_name = "engine-7";
  return m;
}
HelloReply sample_hello_reply() {
  return {.data_bytes = 1ull << 30, .incarnation = 0xdeadbeef, .connection_id = 9,
          .chain_tokens = 64, .block_extent_bytes = 69632, .block_payload_offset = 512};
}
LookupRequest sample_lookup_request() {
  LookupRequest m;
  m.session_id = 42;
  m.prompt_tokens = 3 * 64 + 3;
  m.chunk_hashes = {{1, 2}, {3, 4}, {5, 6}};
  m.tail_tokens = {7, -8, 9};
  return m;
}
LookupReply sample_lookup_reply() {
  LookupReply m;
  m.lease_id = 77;
  m.restorable_tokens = 128;
  m.reuse_kind = static_cast<uint8_t>(ReuseKind::PrivateTurnClosure);
  m.host_blocks = 1;
  m.block_offsets = {0, 69632};
  m.block_checksums = {0x1111222233334444ull, 0xfedcba9876543210ull};
  m.snapshots = {{.extent_offset = 4096, .position = 130, .anchor_chunks = 2, .reuse_kind = 1,
                  .ready = 1, .payload_checksum = 0xabcdef0123456789ull},
                 {.extent_offset = 8192, .position = 10, .anchor_chunks = 0, .reuse_kind = 2,
                  .ready = 0, .payload_checksum = 7}};
  return m;
}
ReserveBlocksRequest sample_reserve_blocks_request() {
  ReserveBlocksRequest m;
  m.options = {.session_id = 5, .entry_class = 1, .evidence = 4};
  m.first_chunk = 3;
  m.parent_hash = {8, 9};
  m.chunk_hashes = {{10, 11}, {12, 13}};
  return m;
}
ReserveBlocksReply sample_reserve_blocks_reply() {
  ReserveBlocksReply m;
  m.reservation_id = 8;
  m.grants = {{.extent_offset = 4096, .disposition = 0}, {.extent_offset = 0, .disposition = 1},
              {.extent_offset = 0, .disposition = 2}};
  return m;
}
ReserveSnapshotRequest sample_reserve_snapshot_request() {
  ReserveSnapshotRequest m;
  m.options = {.session_id = 6, .entry_class = 0, .evidence = 2};
  m.anchor_chunks = 2;
  m.anchor_hash = {14, 15};
  m.payload_bytes = 1 << 20;
  m.tail_tokens = {1, 2, 3, 4, 5};
  return m;
}
ReserveSnapshotReply sample_reserve_snapshot_reply() {
  return {.reservation_id = 3, .extent_offset = 8192, .extent_bytes = 1 << 21,
          .payload_offset = 512, .disposition = 0};
}
StatsReply sample_stats_reply() {
  StatsReply m;
  uint64_t* fields = reinterpret_cast<uint64_t*>(&m);
  for (size_t i = 0; i < sizeof m / 8; ++i) fields[i] = 1000 + i;
  return m;
}

template <typename T>
std::function<Status(std::span<const uint8_t>)> decoder() {
  return [](std::span<const uint8_t> body) {
    T value;
    return decode(body, value);
  };
}

std::vector<Sample> all_samples() {
  std::vector<Sample> s;
  auto add = [&](const char* name, auto encode_fn, auto dec) {
    std::vector<uint8_t> out;
    encode_fn(out);
    s.push_back({name, std::move(out), dec});
  };
  add("HelloRequest", [](auto& o) { encode(sample_hello_request(), 1, o); }, decoder<HelloRequest>());
  add("HelloReply", [](auto& o) { encode(sample_hello_reply(), 1, o); }, decoder<HelloReply>());
  add("LookupRequest", [](auto& o) { encode(sample_lookup_request(), 1, o); }, decoder<LookupRequest>());
  add("LookupReply", [](auto& o) { encode(sample_lookup_reply(), 1, o); }, decoder<LookupReply>());
  add("ReleaseRequest", [](auto& o) { encode(ReleaseRequest{99}, 1, o); }, decoder<ReleaseRequest>());
  add("WaitRequest", [](auto& o) { encode(WaitRequest{.lease_id = 4, .timeout_msec = 250}, 1, o); },
      decoder<WaitRequest>());
  add("WaitReply", [](auto& o) { encode(Verb::Wait, sample_lookup_reply(), 1, o); },
      decoder<LookupReply>());
  add("ReserveBlocksRequest", [](auto& o) { encode(sample_reserve_blocks_request(), 1, o); },
      decoder<ReserveBlocksRequest>());
  add("ReserveBlocksReply", [](auto& o) { encode(sample_reserve_blocks_reply(), 1, o); },
      decoder<ReserveBlocksReply>());
  add("ReserveSnapshotRequest", [](auto& o) { encode(sample_reserve_snapshot_request(), 1, o); },
      decoder<ReserveSnapshotRequest>());
  add("ReserveSnapshotReply", [](auto& o) { encode(sample_reserve_snapshot_reply(), 1, o); },
      decoder<ReserveSnapshotReply>());
  add("SealRequest", [](auto& o) { encode(Verb::Seal, ReservationRequest{.reservation_id = 5, .payload_checksums = {1, 2}}, 1, o); },
      decoder<ReservationRequest>());
  add("AbortRequest", [](auto& o) { encode(Verb::Abort, ReservationRequest{.reservation_id = 6}, 1, o); },
      decoder<ReservationRequest>());
  add("CorruptReport", [](auto& o) { encode(CorruptReport{.lease_id = 3, .extent_offset = 4096}, 1, o); },
      decoder<CorruptReport>());
  add("StatsReply", [](auto& o) { encode(sample_stats_reply(), 1, o); }, decoder<StatsReply>());
  return s;
}

// Decodes a whole message: header, then body as T.
template <typename T>
Status decode_message(const std::vector<uint8_t>& message, FrameHeader& header, T& ret) {
  std::span<const uint8_t> body;
  if (Status s = decode_header(message, header, body); s != Status::Ok) return s;
  return decode(body, ret);
}

template <typename T>
T round_trip(const std::vector<uint8_t>& message, uint16_t expected_verb) {
  FrameHeader header;
  T value;
  EXPECT_EQ(decode_message(message, header, value), Status::Ok);
  EXPECT_EQ(header.verb, expected_verb);
  EXPECT_EQ(header.sequence, 1u);
  EXPECT_EQ(header.status, 0u);
  EXPECT_EQ(header.reserved, 0u);
  EXPECT_EQ(header.body_bytes, message.size() - frame_header_bytes);
  return value;
}

std::vector<uint8_t> body_of(const std::vector<uint8_t>& message) {
  return {message.begin() + frame_header_bytes, message.end()};
}

// LookupReply grows as features land; tests find its counts from the encoder:
// the fixed part ends with the block and snapshot counts.
struct LookupReplyLayout {
  size_t fixed_bytes, blocks_count_at, snapshots_count_at, candidate_bytes;
};
LookupReplyLayout lookup_reply_layout() {
  std::vector<uint8_t> empty, one;
  encode(LookupReply{}, 1, empty);
  LookupReply r;
  r.snapshots.resize(1);
  encode(r, 1, one);
  const size_t fixed = empty.size() - frame_header_bytes;
  return {fixed, fixed - 8, fixed - 4, one.size() - empty.size()};
}

constexpr uint16_t R(Verb v) { return static_cast<uint16_t>(v) | reply_bit; }
constexpr uint16_t Q(Verb v) { return static_cast<uint16_t>(v); }

TEST(FrameCodec, HelloRequestRoundTrips) {
  const HelloRequest in = sample_hello_request();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<HelloRequest>(m, Q(Verb::Hello));
  EXPECT_EQ(out.protocol_version, in.protocol_version);
  EXPECT_EQ(out.namespace_id, in.namespace_id);
  EXPECT_EQ(out.geometry, in.geometry);
  EXPECT_EQ(out.prefill_tokens_per_second, in.prefill_tokens_per_second);
  EXPECT_EQ(out.client_name, in.client_name);
  EXPECT_FALSE(out.holds_earlier_grants);
}

TEST(FrameCodec, HelloRequestCarriesEarlierPlansApartFromTheSnapshotFlag) {
  for (const bool snapshot_required : {false, true}) {
    HelloRequest in = sample_hello_request();
    in.geometry.snapshot_required = snapshot_required;
    in.holds_earlier_grants = true;
    std::vector<uint8_t> m;
    encode(in, 1, m);
    const auto out = round_trip<HelloRequest>(m, Q(Verb::Hello));
    EXPECT_TRUE(out.holds_earlier_grants);
    EXPECT_EQ(out.geometry.snapshot_required, snapshot_required);
  }
}

TEST(FrameCodec, HelloReplyRoundTrips) {
  const HelloReply in = sample_hello_reply();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<HelloReply>(m, R(Verb::Hello));
  EXPECT_EQ(out.data_bytes, in.data_bytes);
  EXPECT_EQ(out.incarnation, in.incarnation);
  EXPECT_EQ(out.connection_id, in.connection_id);
  EXPECT_EQ(out.chain_tokens, in.chain_tokens);
  EXPECT_EQ(out.block_extent_bytes, in.block_extent_bytes);
  EXPECT_EQ(out.block_payload_offset, in.block_payload_offset);
}

TEST(FrameCodec, LookupRequestRoundTrips) {
  const LookupRequest in = sample_lookup_request();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<LookupRequest>(m, Q(Verb::Lookup));
  EXPECT_EQ(out.session_id, in.session_id);
  EXPECT_EQ(out.prompt_tokens, in.prompt_tokens);
  EXPECT_EQ(out.chunk_hashes, in.chunk_hashes);
  EXPECT_EQ(out.tail_tokens, in.tail_tokens);
}

TEST(FrameCodec, LookupReplyRoundTrips) {
  const LookupReply in = sample_lookup_reply();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<LookupReply>(m, R(Verb::Lookup));
  EXPECT_EQ(out.lease_id, in.lease_id);
  EXPECT_EQ(out.restorable_tokens, in.restorable_tokens);
  EXPECT_EQ(out.reuse_kind, in.reuse_kind);
  EXPECT_EQ(out.host_blocks, in.host_blocks);
  EXPECT_EQ(out.block_offsets, in.block_offsets);
  EXPECT_EQ(out.block_checksums, in.block_checksums);
  ASSERT_EQ(out.snapshots.size(), in.snapshots.size());
  for (size_t i = 0; i < in.snapshots.size(); ++i) {
    EXPECT_EQ(out.snapshots[i].extent_offset, in.snapshots[i].extent_offset);
    EXPECT_EQ(out.snapshots[i].position, in.snapshots[i].position);
    EXPECT_EQ(out.snapshots[i].anchor_chunks, in.snapshots[i].anchor_chunks);
    EXPECT_EQ(out.snapshots[i].reuse_kind, in.snapshots[i].reuse_kind);
    EXPECT_EQ(out.snapshots[i].ready, in.snapshots[i].ready);
    EXPECT_EQ(out.snapshots[i].payload_checksum, in.snapshots[i].payload_checksum);
  }
  // The same reply answers WAIT.
  m.clear();
  encode(Verb::Wait, in, 1, m);
  EXPECT_EQ(round_trip<LookupReply>(m, R(Verb::Wait)).block_offsets, in.block_offsets);
}

TEST(FrameCodec, WaitRequestRoundTrips) {
  std::vector<uint8_t> m;
  encode(WaitRequest{.lease_id = 0x55, .timeout_msec = 1234}, 1, m);
  const auto out = round_trip<WaitRequest>(m, Q(Verb::Wait));
  EXPECT_EQ(out.lease_id, 0x55u);
  EXPECT_EQ(out.timeout_msec, 1234u);
  std::vector<uint8_t> body = body_of(m);
  body.back() = 1;  // padding must be zero
  WaitRequest bad;
  EXPECT_EQ(decode(body, bad), Status::ProtocolError);
}

TEST(FrameCodec, ReleaseSealAbortRoundTrip) {
  std::vector<uint8_t> m;
  encode(ReleaseRequest{0x0102030405060708ull, 4097}, 1, m);
  const auto released = round_trip<ReleaseRequest>(m, Q(Verb::Release));
  EXPECT_EQ(released.lease_id, 0x0102030405060708ull);
  EXPECT_EQ(released.restored_tokens, 4097u);
  m.clear();
  encode(Verb::Seal, ReservationRequest{.reservation_id = 11, .payload_checksums = {3, 0xffffffffffffffffull}}, 1, m);
  const auto sealed = round_trip<ReservationRequest>(m, Q(Verb::Seal));
  EXPECT_EQ(sealed.reservation_id, 11u);
  EXPECT_EQ(sealed.payload_checksums, (std::vector<uint64_t>{3, 0xffffffffffffffffull}));
  m.clear();
  encode(Verb::Abort, ReservationRequest{.reservation_id = 12}, 1, m);
  EXPECT_EQ(round_trip<ReservationRequest>(m, Q(Verb::Abort)).reservation_id, 12u);
  m.clear();
  encode(CorruptReport{.lease_id = 9, .extent_offset = 0x3000}, 1, m);
  const auto report = round_trip<CorruptReport>(m, Q(Verb::ReportCorrupt));
  EXPECT_EQ(report.lease_id, 9u);
  EXPECT_EQ(report.extent_offset, 0x3000u);
}

TEST(FrameCodec, ReserveBlocksRoundTrips) {
  const ReserveBlocksRequest in = sample_reserve_blocks_request();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<ReserveBlocksRequest>(m, Q(Verb::ReserveBlocks));
  EXPECT_EQ(out.options.session_id, in.options.session_id);
  EXPECT_EQ(out.options.entry_class, in.options.entry_class);
  EXPECT_EQ(out.options.evidence, in.options.evidence);
  EXPECT_EQ(out.first_chunk, in.first_chunk);
  EXPECT_EQ(out.parent_hash, in.parent_hash);
  EXPECT_EQ(out.chunk_hashes, in.chunk_hashes);

  const ReserveBlocksReply rin = sample_reserve_blocks_reply();
  m.clear();
  encode(rin, 1, m);
  const auto rout = round_trip<ReserveBlocksReply>(m, R(Verb::ReserveBlocks));
  EXPECT_EQ(rout.reservation_id, rin.reservation_id);
  ASSERT_EQ(rout.grants.size(), rin.grants.size());
  for (size_t i = 0; i < rin.grants.size(); ++i) {
    EXPECT_EQ(rout.grants[i].extent_offset, rin.grants[i].extent_offset);
    EXPECT_EQ(rout.grants[i].disposition, rin.grants[i].disposition);
  }
}

TEST(FrameCodec, ReserveSnapshotRoundTrips) {
  const ReserveSnapshotRequest in = sample_reserve_snapshot_request();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<ReserveSnapshotRequest>(m, Q(Verb::ReserveSnapshot));
  EXPECT_EQ(out.options.session_id, in.options.session_id);
  EXPECT_EQ(out.options.evidence, in.options.evidence);
  EXPECT_EQ(out.anchor_chunks, in.anchor_chunks);
  EXPECT_EQ(out.anchor_hash, in.anchor_hash);
  EXPECT_EQ(out.payload_bytes, in.payload_bytes);
  EXPECT_EQ(out.tail_tokens, in.tail_tokens);

  const ReserveSnapshotReply rin = sample_reserve_snapshot_reply();
  m.clear();
  encode(rin, 1, m);
  const auto rout = round_trip<ReserveSnapshotReply>(m, R(Verb::ReserveSnapshot));
  EXPECT_EQ(rout.reservation_id, rin.reservation_id);
  EXPECT_EQ(rout.extent_offset, rin.extent_offset);
  EXPECT_EQ(rout.extent_bytes, rin.extent_bytes);
  EXPECT_EQ(rout.payload_offset, rin.payload_offset);
  EXPECT_EQ(rout.disposition, rin.disposition);
}

TEST(FrameCodec, StatsReplyRoundTrips) {
  const StatsReply in = sample_stats_reply();
  std::vector<uint8_t> m;
  encode(in, 1, m);
  const auto out = round_trip<StatsReply>(m, R(Verb::Stats));
  EXPECT_EQ(std::memcmp(&out, &in, sizeof in), 0);
}

TEST(FrameCodec, HeaderOnlyFrameCarriesStatus) {
  std::vector<uint8_t> m;
  encode(R(Verb::Seal), static_cast<uint16_t>(Status::Corrupt), 77, m);
  ASSERT_EQ(m.size(), frame_header_bytes);
  FrameHeader h;
  std::span<const uint8_t> body;
  ASSERT_EQ(decode_header(m, h, body), Status::Ok);
  EXPECT_EQ(h.verb, R(Verb::Seal));
  EXPECT_EQ(h.status, static_cast<uint16_t>(Status::Corrupt));
  EXPECT_EQ(h.sequence, 77u);
  EXPECT_TRUE(body.empty());
}

TEST(FrameCodec, EmptyClientNameAndEmptyArraysRoundTrip) {
  HelloRequest h = sample_hello_request();
  h.client_name.clear();
  std::vector<uint8_t> m;
  encode(h, 1, m);
  EXPECT_EQ(round_trip<HelloRequest>(m, Q(Verb::Hello)).client_name, "");
  LookupRequest l;
  l.prompt_tokens = 0;
  m.clear();
  encode(l, 1, m);
  const auto out = round_trip<LookupRequest>(m, Q(Verb::Lookup));
  EXPECT_TRUE(out.chunk_hashes.empty() && out.tail_tokens.empty());
}

TEST(FrameDecoder, RejectsTruncationAtEveryByte) {
  for (const Sample& s : all_samples()) {
    for (size_t k = 0; k < s.message.size(); ++k) {
      FrameHeader h;
      std::span<const uint8_t> body;
      EXPECT_EQ(decode_header({s.message.data(), k}, h, body), Status::ProtocolError)
          << s.name << " truncated to " << k;
    }
    // The body decoder alone, with a shortened body.
    const std::span<const uint8_t> full_body(s.message.data() + frame_header_bytes,
                                             s.message.size() - frame_header_bytes);
    for (size_t k = 0; k < full_body.size(); ++k) {
      // A RELEASE cut after its lease id is a protocol-2 RELEASE, which decodes
      // (ReleaseOfProtocol2DecodesAsNothingRestored).
      if (std::string(s.name) == "ReleaseRequest" && k == sizeof(uint64_t)) continue;
      EXPECT_EQ(s.decode_body(full_body.first(k)), Status::ProtocolError)
          << s.name << " body truncated to " << k;
    }
    EXPECT_EQ(s.decode_body(full_body), Status::Ok) << s.name;
  }
}

TEST(FrameDecoder, RejectsTrailingByte) {
  for (const Sample& s : all_samples()) {
    std::vector<uint8_t> longer = s.message;
    longer.push_back(0);
    FrameHeader h;
    std::span<const uint8_t> body;
    EXPECT_EQ(decode_header(longer, h, body), Status::ProtocolError) << s.name;
    // Header patched to admit the extra byte: the body decoder must still refuse it.
    const uint32_t body_bytes = static_cast<uint32_t>(longer.size() - frame_header_bytes);
    std::memcpy(longer.data() + 8, &body_bytes, 4);
    ASSERT_EQ(decode_header(longer, h, body), Status::Ok) << s.name;
    EXPECT_EQ(s.decode_body(body), Status::ProtocolError) << s.name;
  }
}

TEST(FrameDecoder, RejectsLyingBodyLength) {
  std::vector<uint8_t> m;
  encode(sample_lookup_request(), 1, m);
  FrameHeader h;
  std::span<const uint8_t> body;
  const uint32_t real = static_cast<uint32_t>(m.size() - frame_header_bytes);
  for (uint32_t lie : {real - 1, real + 1, 0u, UINT32_MAX, real * 2}) {
    std::vector<uint8_t> bad = m;
    std::memcpy(bad.data() + 8, &lie, 4);
    EXPECT_EQ(decode_header(bad, h, body), Status::ProtocolError) << "body_bytes " << lie;
  }
}

TEST(FrameDecoder, RejectsShortAndOversizedMessages) {
  std::vector<uint8_t> m(frame_header_bytes - 1, 0);
  FrameHeader h;
  std::span<const uint8_t> body;
  EXPECT_EQ(decode_header(m, h, body), Status::ProtocolError);
  // A well-formed header announcing a body that makes the frame one byte too big.
  std::vector<uint8_t> big(limits::frame_bytes_max + 1, 0);
  std::vector<uint8_t> header;
  encode(Q(Verb::Stats), 0, 1, header);
  std::memcpy(big.data(), header.data(), header.size());
  const uint32_t body_bytes = static_cast<uint32_t>(big.size() - frame_header_bytes);
  std::memcpy(big.data() + 8, &body_bytes, 4);
  EXPECT_EQ(decode_header(big, h, body), Status::ProtocolError);
  // Exactly frame_bytes_max is a legal frame size.
  big.pop_back();
  const uint32_t max_body = static_cast<uint32_t>(big.size() - frame_header_bytes);
  std::memcpy(big.data() + 8, &max_body, 4);
  EXPECT_EQ(decode_header(big, h, body), Status::Ok);
}

TEST(FrameDecoder, RejectsUnknownVerb) {
  FrameHeader h;
  std::span<const uint8_t> body;
  for (uint16_t verb : {uint16_t{0}, uint16_t{verb_max + 1}, uint16_t{0x7fff}, reply_bit,
                        uint16_t(reply_bit | (verb_max + 1)), uint16_t{0xffff}}) {
    std::vector<uint8_t> m;
    encode(verb, 0, 1, m);
    EXPECT_EQ(decode_header(m, h, body), Status::ProtocolError) << "verb " << verb;
  }
  for (uint16_t verb = 1; verb <= verb_max; ++verb) {
    std::vector<uint8_t> m;
    encode(verb, 0, 1, m);
    EXPECT_EQ(decode_header(m, h, body), Status::Ok) << "verb " << verb;
    m.clear();
    encode(uint16_t(verb | reply_bit), 0, 1, m);
    EXPECT_EQ(decode_header(m, h, body), Status::Ok) << "reply verb " << verb;
  }
}

TEST(FrameDecoder, RejectsUnknownStatus) {
  FrameHeader h;
  std::span<const uint8_t> body;
  std::vector<uint8_t> m;
  encode(R(Verb::Seal), static_cast<uint16_t>(Status::IoError), 1, m);
  EXPECT_EQ(decode_header(m, h, body), Status::Ok);
  uint16_t first_unknown = 0;
  while (status_is_known(first_unknown)) ++first_unknown;
  EXPECT_GE(first_unknown, 14);
  for (uint16_t status : {first_unknown, uint16_t{0xffff}}) {
    m.clear();
    encode(R(Verb::Seal), status, 1, m);
    EXPECT_EQ(decode_header(m, h, body), Status::ProtocolError) << "status " << status;
  }
}

// Protocol 2 clients send RELEASE without restored_tokens: it decodes as nothing
// restored. Anything between the two sizes, or past the longer, is refused.
TEST(FrameDecoder, ReleaseOfProtocol2DecodesAsNothingRestored) {
  const uint64_t lease_id = 0x1122334455667788ull;
  std::vector<uint8_t> body(sizeof lease_id);
  std::memcpy(body.data(), &lease_id, sizeof lease_id);
  ReleaseRequest r{.lease_id = 1, .restored_tokens = 9};
  ASSERT_EQ(decode(body, r), Status::Ok);
  EXPECT_EQ(r.lease_id, lease_id);
  EXPECT_EQ(r.restored_tokens, 0u);
  for (size_t size : {size_t{0}, size_t{7}, size_t{9}, size_t{11}, size_t{13}, size_t{16}}) {
    std::vector<uint8_t> wrong(size, 0);
    EXPECT_EQ(decode(wrong, r), Status::ProtocolError) << size << " bytes";
  }
  body.resize(12, 0);
  EXPECT_EQ(decode(body, r), Status::Ok);
}

TEST(FrameDecoder, RejectsNonzeroReserved) {
  std::vector<uint8_t> m;
  encode(ReleaseRequest{1}, 1, m);
  for (size_t byte = 12; byte < 16; ++byte) {
    std::vector<uint8_t> bad = m;
    bad[byte] = 1;
    FrameHeader h;
    std::span<const uint8_t> body;
    EXPECT_EQ(decode_header(bad, h, body), Status::ProtocolError) << "reserved byte " << byte;
  }
}

// Patches a uint32 count in a body and checks the decoder refuses it.
template <typename T>
void expect_count_lie_rejected(std::vector<uint8_t> body, size_t count_offset, int delta) {
  uint32_t count = 0;
  std::memcpy(&count, body.data() + count_offset, 4);
  count = static_cast<uint32_t>(int64_t{count} + delta);
  std::memcpy(body.data() + count_offset, &count, 4);
  T value;
  EXPECT_EQ(decode(body, value), Status::ProtocolError)
      << "count at " << count_offset << " off by " << delta;
}

TEST(FrameDecoder, RejectsCountsThatLie) {
  std::vector<uint8_t> m;
  // LookupRequest: session u64, prompt u32, chunks u32 @12, tail u32 @16.
  encode(sample_lookup_request(), 1, m);
  for (int delta : {-1, 1, 1000, -3}) {
    expect_count_lie_rejected<LookupRequest>(body_of(m), 12, delta);
  }
  for (int delta : {-1, 1, 1000}) expect_count_lie_rejected<LookupRequest>(body_of(m), 16, delta);
  // LookupReply: lease u64, restorable u32, kind u8, pad u8, pad u16, host_blocks u32 @16,
  // ..., blocks u32, snapshots u32.
  const LookupReplyLayout layout = lookup_reply_layout();
  m.clear();
  encode(sample_lookup_reply(), 1, m);
  for (int delta : {-1, 1}) {
    expect_count_lie_rejected<LookupReply>(body_of(m), layout.blocks_count_at, delta);
    expect_count_lie_rejected<LookupReply>(body_of(m), layout.snapshots_count_at, delta);
  }
  // host_blocks past the blocks the reply carries.
  expect_count_lie_rejected<LookupReply>(body_of(m), 16, 2);
  // ReserveBlocksRequest: options 12 bytes, first_chunk u32, parent hash 16 bytes, count u32 @32.
  m.clear();
  encode(sample_reserve_blocks_request(), 1, m);
  for (int delta : {-1, 1, 5}) expect_count_lie_rejected<ReserveBlocksRequest>(body_of(m), 32, delta);
  // ReserveBlocksReply: reservation u64, count u32 @8.
  m.clear();
  encode(sample_reserve_blocks_reply(), 1, m);
  for (int delta : {-1, 1}) expect_count_lie_rejected<ReserveBlocksReply>(body_of(m), 8, delta);
  // ReserveSnapshotRequest: options 12, anchor u32, hash 16, payload u64, tail u32 @40.
  m.clear();
  encode(sample_reserve_snapshot_request(), 1, m);
  for (int delta : {-1, 1}) expect_count_lie_rejected<ReserveSnapshotRequest>(body_of(m), 40, delta);
  // HelloRequest: version u16, flags u16, block_tokens u32, payload u64, ns 16, rate u32,
  // name_bytes u32 @36.
  m.clear();
  encode(sample_hello_request(), 1, m);
  for (int delta : {-1, 1}) expect_count_lie_rejected<HelloRequest>(body_of(m), 36, delta);
}

TEST(FrameDecoder, AcceptsCountsAtCapAndRejectsCapPlusOne) {
  // LOOKUP chunk hashes: lookup_chunks_max is legal, one more is not even with the bytes present.
  LookupRequest l;
  l.chunk_hashes.resize(limits::lookup_chunks_max);
  std::vector<uint8_t> m;
  encode(l, 1, m);
  LookupRequest out;
  EXPECT_EQ(decode(body_of(m), out), Status::Ok);
  std::vector<uint8_t> body = body_of(m);
  body.insert(body.end(), 16, 0);
  uint32_t over = limits::lookup_chunks_max + 1;
  std::memcpy(body.data() + 12, &over, 4);
  EXPECT_EQ(decode(body, out), Status::ProtocolError);

  // LOOKUP tail tokens: block_tokens_max.
  l = LookupRequest{};
  l.tail_tokens.resize(limits::block_tokens_max);
  m.clear();
  encode(l, 1, m);
  EXPECT_EQ(decode(body_of(m), out), Status::Ok);
  body = body_of(m);
  body.insert(body.end(), 4, 0);
  over = limits::block_tokens_max + 1;
  std::memcpy(body.data() + 16, &over, 4);
  EXPECT_EQ(decode(body, out), Status::ProtocolError);

  // RESERVE block hashes: reserve_blocks_max.
  ReserveBlocksRequest r;
  r.chunk_hashes.resize(limits::reserve_blocks_max);
  m.clear();
  encode(r, 1, m);
  ReserveBlocksRequest rout;
  EXPECT_EQ(decode(body_of(m), rout), Status::Ok);
  body = body_of(m);
  body.insert(body.end(), 16, 0);
  over = limits::reserve_blocks_max + 1;
  std::memcpy(body.data() + 16, &over, 4);
  EXPECT_EQ(decode(body, rout), Status::ProtocolError);

  // RESERVE reply grants.
  ReserveBlocksReply g;
  g.grants.resize(limits::reserve_blocks_max);
  m.clear();
  encode(g, 1, m);
  ReserveBlocksReply gout;
  EXPECT_EQ(decode(body_of(m), gout), Status::Ok);
  body = body_of(m);
  body.insert(body.end(), 12, 0);
  over = limits::reserve_blocks_max + 1;
  std::memcpy(body.data() + 8, &over, 4);
  EXPECT_EQ(decode(body, gout), Status::ProtocolError);

  // HELLO client name.
  HelloRequest h = sample_hello_request();
  h.client_name.assign(limits::client_name_bytes_max, 'x');
  m.clear();
  encode(h, 1, m);
  HelloRequest hout;
  EXPECT_EQ(decode(body_of(m), hout), Status::Ok);
  body = body_of(m);
  body.push_back('x');
  over = limits::client_name_bytes_max + 1;
  std::memcpy(body.data() + 36, &over, 4);
  EXPECT_EQ(decode(body, hout), Status::ProtocolError);

  // LOOKUP reply snapshot candidates.
  LookupReply lr;
  lr.snapshots.resize(limits::lookup_snapshot_candidates_max);
  m.clear();
  encode(lr, 1, m);
  LookupReply lrout;
  EXPECT_EQ(decode(body_of(m), lrout), Status::Ok);
  body = body_of(m);
  const LookupReplyLayout layout = lookup_reply_layout();
  body.insert(body.end(), layout.candidate_bytes, 0);
  over = limits::lookup_snapshot_candidates_max + 1;
  std::memcpy(body.data() + layout.snapshots_count_at, &over, 4);
  EXPECT_EQ(decode(body, lrout), Status::ProtocolError);
}

TEST(FrameDecoder, RejectsHugeCountWithoutAllocating) {
  // A count near 2^32 with a tiny body must fail on the byte check, not on allocation.
  LookupRequest l;
  std::vector<uint8_t> m;
  encode(l, 1, m);
  std::vector<uint8_t> body = body_of(m);
  const uint32_t huge = UINT32_MAX;
  std::memcpy(body.data() + 16, &huge, 4);
  LookupRequest out;
  EXPECT_EQ(decode(body, out), Status::ProtocolError);
  ReserveBlocksReply g;
  m.clear();
  encode(g, 1, m);
  body = body_of(m);
  std::memcpy(body.data() + 8, &huge, 4);
  ReserveBlocksReply gout;
  EXPECT_EQ(decode(body, gout), Status::ProtocolError);
}

TEST(FrameDecoder, RejectsOutOfRangeEnumsAndPadding) {
  std::vector<uint8_t> m;
  // PublishOptions: session u64, class u8 @8, evidence u8 @9, pad u16 @10.
  encode(sample_reserve_blocks_request(), 1, m);
  auto patched = [&](size_t at, uint8_t value) {
    std::vector<uint8_t> b = body_of(m);
    b[at] = value;
    return b;
  };
  ReserveBlocksRequest r;
  EXPECT_EQ(decode(patched(8, entry_class_max + 1), r), Status::ProtocolError);
  EXPECT_EQ(decode(patched(9, evidence_max + 1), r), Status::ProtocolError);
  EXPECT_EQ(decode(patched(10, 1), r), Status::ProtocolError);
  EXPECT_EQ(decode(patched(11, 1), r), Status::ProtocolError);
  m.clear();
  encode(sample_reserve_snapshot_request(), 1, m);
  ReserveSnapshotRequest s;
  EXPECT_EQ(decode(patched(9, evidence_max + 1), s), Status::ProtocolError);
  // HELLO flags: only bits 0 and 1 exist.
  m.clear();
  encode(sample_hello_request(), 1, m);
  HelloRequest h;
  EXPECT_EQ(decode(patched(2, 4), h), Status::ProtocolError);
  EXPECT_EQ(decode(patched(3, 1), h), Status::ProtocolError);
  // LOOKUP reply reuse kinds.
  m.clear();
  encode(sample_lookup_reply(), 1, m);
  LookupReply lr;
  EXPECT_EQ(decode(patched(12, reuse_kind_max + 1), lr), Status::ProtocolError);
  const size_t first_candidate = lookup_reply_layout().fixed_bytes + 2 * (8 + 8);  // after 2 offsets and checksums
  EXPECT_EQ(decode(patched(first_candidate + 16, reuse_kind_max + 1), lr), Status::ProtocolError);
  EXPECT_EQ(decode(patched(first_candidate + 20, 2), lr), Status::ProtocolError) << "ready is 0/1";
  EXPECT_EQ(decode(patched(first_candidate + 24, 1), lr), Status::ProtocolError) << "padding is 0";
  // Dispositions.
  m.clear();
  encode(sample_reserve_blocks_reply(), 1, m);
  ReserveBlocksReply g;
  EXPECT_EQ(decode(patched(12 + 8, 3), g), Status::ProtocolError);
  m.clear();
  encode(sample_reserve_snapshot_reply(), 1, m);
  ReserveSnapshotReply sr;
  EXPECT_EQ(decode(patched(28, 3), sr), Status::ProtocolError);
}

TEST(FrameEncoder, PatchesBodyLengthAndAppends) {
  std::vector<uint8_t> out;
  encode(ReleaseRequest{1}, 1, out);
  encode(sample_lookup_request(), 2, out);
  const size_t first = frame_header_bytes + 12;  // RELEASE: lease id, restored tokens
  FrameHeader h;
  std::span<const uint8_t> body;
  ASSERT_EQ(decode_header({out.data(), first}, h, body), Status::Ok);
  EXPECT_EQ(h.verb, Q(Verb::Release));
  ASSERT_EQ(decode_header({out.data() + first, out.size() - first}, h, body), Status::Ok);
  EXPECT_EQ(h.verb, Q(Verb::Lookup));
  EXPECT_EQ(h.sequence, 2u);
}

}  // namespace
}  // namespace kvpark::wire
