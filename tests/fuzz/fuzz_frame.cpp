// libFuzzer target for the kvparkd frame decoder (proto/wire.cpp).
//
// Feeds bytes to wire::decode_header, then to the decoder for the frame's verb
// (request or reply). Decoding must never crash, read out of bounds or allocate
// more than the bytes present justify; and where an encoding is canonical (every
// request, and the replies without unchecked padding), anything that decodes must
// re-encode to exactly the input bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "proto/wire.h"

using namespace kvpark;
using namespace kvpark::wire;

namespace {

[[noreturn]] void fail(const char* what, const std::vector<uint8_t>& got,
                       std::span<const uint8_t> want) {
  fprintf(stderr, "fuzz_frame: %s: re-encoded %zu bytes, input %zu bytes\n", what, got.size(),
          want.size());
  abort();
}

// The re-encoding carries the input's status (encoders write 0 for requests).
void expect_same(const char* what, std::vector<uint8_t> encoded, const FrameHeader& header,
                 std::span<const uint8_t> message) {
  if (encoded.size() >= 4) std::memcpy(encoded.data() + 2, &header.status, 2);
  if (encoded.size() != message.size() ||
      std::memcmp(encoded.data(), message.data(), message.size()) != 0) {
    fail(what, encoded, message);
  }
}

template <typename T, typename Encode>
void check(const char* what, std::span<const uint8_t> body, const FrameHeader& header,
           std::span<const uint8_t> message, bool canonical, Encode&& encode_fn) {
  T value;
  if (decode(body, value) != Status::Ok) return;
  std::vector<uint8_t> out;
  encode_fn(value, header.sequence, out);
  if (canonical) expect_same(what, std::move(out), header, message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> message(data, size);
  FrameHeader header;
  std::span<const uint8_t> body;
  if (decode_header(message, header, body) != Status::Ok) return 0;
  if (header.body_bytes != body.size() || header.reserved != 0) abort();
  const bool is_reply = (header.verb & reply_bit) != 0;
  const auto verb = static_cast<Verb>(header.verb & ~reply_bit);
  auto plain = [](const auto& v, uint32_t seq, std::vector<uint8_t>& out) { encode(v, seq, out); };
  // A protocol-2 RELEASE (lease id only) decodes, and re-encodes in the protocol-3 form.
  const bool release_canonical = body.size() != sizeof(uint64_t);

  if (!is_reply) {
    switch (verb) {
      case Verb::Hello: check<HelloRequest>("HelloRequest", body, header, message, true, plain); break;
      case Verb::Lookup: check<LookupRequest>("LookupRequest", body, header, message, true, plain); break;
      case Verb::Release:
        check<ReleaseRequest>("ReleaseRequest", body, header, message, release_canonical, plain);
        break;
      case Verb::Wait: check<WaitRequest>("WaitRequest", body, header, message, true, plain); break;
      case Verb::ReleaseOneWay:
        check<ReleaseRequest>("ReleaseOneWay", body, header, message, release_canonical,
                              [](const ReleaseRequest& v, uint32_t seq, std::vector<uint8_t>& out) {
                                encode(v, seq, out, Verb::ReleaseOneWay);
                              });
        break;
      case Verb::ReserveBlocks:
        check<ReserveBlocksRequest>("ReserveBlocksRequest", body, header, message, true, plain);
        break;
      case Verb::ReserveSnapshot:
        check<ReserveSnapshotRequest>("ReserveSnapshotRequest", body, header, message, true, plain);
        break;
      case Verb::Seal:
      case Verb::Abort:
        check<ReservationRequest>("ReservationRequest", body, header, message, true,
                                  [verb](const ReservationRequest& v, uint32_t seq,
                                         std::vector<uint8_t>& out) { encode(verb, v, seq, out); });
        break;
      case Verb::ReportCorrupt:
        check<CorruptReport>("CorruptReport", body, header, message, true, plain);
        break;
      case Verb::Stats:
        if (body.empty()) {
          std::vector<uint8_t> out;
          encode(header.verb, header.status, header.sequence, out);
          expect_same("StatsRequest", std::move(out), header, message);
        }
        break;
    }
    return 0;
  }
  switch (verb) {
    case Verb::Hello: check<HelloReply>("HelloReply", body, header, message, true, plain); break;
    // Its padding bytes are not checked on decode, so only decoding is exercised.
    case Verb::Lookup: check<LookupReply>("LookupReply", body, header, message, false, plain); break;
    case Verb::Wait: check<LookupReply>("WaitReply", body, header, message, false, plain); break;
    case Verb::ReserveBlocks:
      check<ReserveBlocksReply>("ReserveBlocksReply", body, header, message, true, plain);
      break;
    case Verb::ReserveSnapshot:
      check<ReserveSnapshotReply>("ReserveSnapshotReply", body, header, message, true, plain);
      break;
    case Verb::Stats: check<StatsReply>("StatsReply", body, header, message, true, plain); break;
    case Verb::Release:
    case Verb::ReleaseOneWay:
    case Verb::Seal:
    case Verb::Abort:
    case Verb::ReportCorrupt:
      break;  // header-only replies (RELEASE_ONE_WAY and REPORT_CORRUPT have none)
  }
  return 0;
}

#ifdef KVPARK_FUZZ_SEED_WRITER
// Built without -fsanitize=fuzzer: writes one valid frame per verb and direction
// into the directory given as argv[1], the fuzzer's seed corpus.
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::vector<std::pair<const char*, std::vector<uint8_t>>> seeds;
  auto add = [&](const char* name, auto&& fill) {
    std::vector<uint8_t> out;
    fill(out);
    seeds.emplace_back(name, std::move(out));
  };
  add("hello", [](auto& o) {
    HelloRequest m;
    m.protocol_version = 1;
    m.namespace_id = {1, 2};
    m.geometry = {.block_tokens = 16, .block_payload_bytes = 4096, .snapshot_required = true};
    m.client_name = "seed";
    encode(m, 1, o);
  });
  add("hello_reply", [](auto& o) { encode(HelloReply{.data_bytes = 1 << 24, .chain_tokens = 16}, 1, o); });
  add("lookup", [](auto& o) {
    LookupRequest m;
    m.prompt_tokens = 35;
    m.chunk_hashes = {{1, 2}, {3, 4}};
    m.tail_tokens = {5, 6, 7};
    encode(m, 2, o);
  });
  add("lookup_reply", [](auto& o) {
    LookupReply m;
    m.lease_id = 3;
    m.block_offsets = {0, 4096};
    m.block_checksums = {1, 2};
    m.snapshots = {{.extent_offset = 8192, .position = 35, .anchor_chunks = 2, .reuse_kind = 1}};
    encode(m, 2, o);
  });
  add("release", [](auto& o) { encode(ReleaseRequest{3}, 3, o); });
  add("release_one_way", [](auto& o) { encode(ReleaseRequest{4}, 3, o, Verb::ReleaseOneWay); });
  add("wait", [](auto& o) { encode(WaitRequest{.lease_id = 3, .timeout_msec = 100}, 3, o); });
  add("reserve", [](auto& o) {
    ReserveBlocksRequest m;
    m.options.evidence = 2;
    m.chunk_hashes = {{1, 2}, {3, 4}};
    encode(m, 4, o);
  });
  add("reserve_reply", [](auto& o) {
    ReserveBlocksReply m;
    m.reservation_id = 5;
    m.grants = {{.extent_offset = 4096, .disposition = 0}, {.disposition = 1}};
    encode(m, 4, o);
  });
  add("snapshot", [](auto& o) {
    ReserveSnapshotRequest m;
    m.anchor_chunks = 1;
    m.anchor_hash = {1, 2};
    m.payload_bytes = 100;
    m.tail_tokens = {1, 2, 3};
    encode(m, 5, o);
  });
  add("snapshot_reply", [](auto& o) { encode(ReserveSnapshotReply{.reservation_id = 6}, 5, o); });
  add("seal", [](auto& o) { encode(Verb::Seal, ReservationRequest{6}, 6, o); });
  add("abort", [](auto& o) { encode(Verb::Abort, ReservationRequest{6}, 7, o); });
  add("stats", [](auto& o) { encode(uint16_t(Verb::Stats), 0, 8, o); });
  add("stats_reply", [](auto& o) { encode(StatsReply{.blocks = 9}, 8, o); });
  add("status_reply", [](auto& o) { encode(uint16_t(Verb::Seal) | reply_bit, 10, 9, o); });
  for (const auto& [name, bytes] : seeds) {
    const std::string path = std::string(argv[1]) + "/" + name;
    FILE* f = fopen(path.c_str(), "wb");
    if (f == nullptr) return 1;
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }
  return 0;
}
#endif
