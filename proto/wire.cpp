// Encoding and strict decoding of kvparkd frames (see wire.h for the rules).
#include "proto/wire.h"

#include <bit>
#include <cassert>
#include <cstring>

#include "proto/limits.h"

namespace kvpark::wire {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the wire format is little-endian and encoded by memcpy");

// HELLO flags.
constexpr uint16_t hello_snapshot_required = 1;
constexpr uint16_t hello_holds_earlier_grants = 2;  // protocol 4

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  template <typename T>
  void put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
    out_.insert(out_.end(), bytes, bytes + sizeof(T));
  }
  void put(const Hash128& h) {
    put(h.low);
    put(h.high);
  }
  template <typename T>
  void put_array(const std::vector<T>& values) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
    out_.insert(out_.end(), bytes, bytes + values.size() * sizeof(T));
  }

 private:
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> body) : body_(body) {}
  template <typename T>
  bool get(T& ret) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (body_.size() - offset_ < sizeof(T)) return false;
    std::memcpy(&ret, body_.data() + offset_, sizeof(T));
    offset_ += sizeof(T);
    return true;
  }
  bool get(Hash128& ret) { return get(ret.low) && get(ret.high); }
  // Reads `count` elements after checking that many bytes are present.
  template <typename T>
  bool get_array(uint32_t count, size_t count_max, std::vector<T>& ret) {
    if (count > count_max) return false;
    if ((body_.size() - offset_) / sizeof(T) < count) return false;
    ret.resize(count);
    // memcpy from/to null is undefined even for 0 bytes (an empty vector's data()).
    if (count > 0) std::memcpy(ret.data(), body_.data() + offset_, size_t{count} * sizeof(T));
    offset_ += size_t{count} * sizeof(T);
    return true;
  }
  bool at_end() const { return offset_ == body_.size(); }

 private:
  std::span<const uint8_t> body_;
  size_t offset_ = 0;
};

// Writes a header with a placeholder length, lets `body` append, then patches the length.
template <typename BodyWriter>
void frame(uint16_t verb, uint16_t status, uint32_t sequence, std::vector<uint8_t>& out,
           BodyWriter&& body) {
  const size_t start = out.size();
  Writer w(out);
  w.put(verb);
  w.put(status);
  w.put(sequence);
  w.put(uint32_t{0});
  w.put(uint32_t{0});
  body(w);
  const uint32_t body_bytes = static_cast<uint32_t>(out.size() - start - frame_header_bytes);
  std::memcpy(out.data() + start + 8, &body_bytes, sizeof body_bytes);
  assert(out.size() - start <= limits::frame_bytes_max);
}

uint16_t reply(Verb verb) { return static_cast<uint16_t>(verb) | reply_bit; }
uint16_t request(Verb verb) { return static_cast<uint16_t>(verb); }

Status finish(const Reader& r, bool ok) {
  return ok && r.at_end() ? Status::Ok : Status::ProtocolError;
}

void put_options(Writer& w, const PublishOptions& o) {
  w.put(o.session_id);
  w.put(o.entry_class);
  w.put(o.evidence);
  w.put(uint16_t{0});
}
bool get_options(Reader& r, PublishOptions& o) {
  uint16_t pad = 0;
  return r.get(o.session_id) && r.get(o.entry_class) && r.get(o.evidence) && r.get(pad) &&
         pad == 0 && o.entry_class <= entry_class_max && o.evidence <= evidence_max;
}

}  // namespace

void encode(uint16_t verb, uint16_t status, uint32_t sequence, std::vector<uint8_t>& out) {
  frame(verb, status, sequence, out, [](Writer&) {});
}

void encode(const HelloRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  assert(m.client_name.size() <= limits::client_name_bytes_max);
  frame(request(Verb::Hello), 0, seq, out, [&](Writer& w) {
    w.put(m.protocol_version);
    w.put(static_cast<uint16_t>((m.geometry.snapshot_required ? hello_snapshot_required : 0) |
                                (m.holds_earlier_grants ? hello_holds_earlier_grants : 0)));
    w.put(m.geometry.block_tokens);
    w.put(m.geometry.block_payload_bytes);
    w.put(m.namespace_id);
    w.put(m.prefill_tokens_per_second);
    w.put(static_cast<uint32_t>(m.client_name.size()));
    std::vector<char> name(m.client_name.begin(), m.client_name.end());
    w.put_array(name);
  });
}

Status decode(std::span<const uint8_t> body, HelloRequest& m) {
  Reader r(body);
  uint16_t flags = 0;
  uint32_t name_bytes = 0;
  std::vector<char> name;
  bool ok = r.get(m.protocol_version) && r.get(flags) &&
            (flags & ~(hello_snapshot_required | hello_holds_earlier_grants)) == 0 &&
            r.get(m.geometry.block_tokens) && r.get(m.geometry.block_payload_bytes) &&
            r.get(m.namespace_id) && r.get(m.prefill_tokens_per_second) && r.get(name_bytes) &&
            r.get_array(name_bytes, limits::client_name_bytes_max, name);
  m.geometry.snapshot_required = (flags & hello_snapshot_required) != 0;
  m.holds_earlier_grants = (flags & hello_holds_earlier_grants) != 0;
  m.client_name.assign(name.begin(), name.end());
  return finish(r, ok);
}

void encode(const HelloReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(reply(Verb::Hello), 0, seq, out, [&](Writer& w) {
    w.put(m.data_bytes);
    w.put(m.incarnation);
    w.put(m.connection_id);
    w.put(m.chain_tokens);
    w.put(m.block_extent_bytes);
    w.put(m.block_payload_offset);
    w.put(m.reserved);
  });
}

Status decode(std::span<const uint8_t> body, HelloReply& m) {
  Reader r(body);
  bool ok = r.get(m.data_bytes) && r.get(m.incarnation) && r.get(m.connection_id) &&
            r.get(m.chain_tokens) && r.get(m.block_extent_bytes) &&
            r.get(m.block_payload_offset) && r.get(m.reserved);
  return finish(r, ok);
}

void encode(const LookupRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(request(Verb::Lookup), 0, seq, out, [&](Writer& w) {
    w.put(m.session_id);
    w.put(m.prompt_tokens);
    w.put(static_cast<uint32_t>(m.chunk_hashes.size()));
    w.put(static_cast<uint32_t>(m.tail_tokens.size()));
    w.put_array(m.chunk_hashes);
    w.put_array(m.tail_tokens);
  });
}

Status decode(std::span<const uint8_t> body, LookupRequest& m) {
  Reader r(body);
  uint32_t chunks = 0, tail = 0;
  bool ok = r.get(m.session_id) && r.get(m.prompt_tokens) && r.get(chunks) && r.get(tail) &&
            r.get_array(chunks, limits::lookup_chunks_max, m.chunk_hashes) &&
            r.get_array(tail, limits::block_tokens_max, m.tail_tokens);
  return finish(r, ok);
}

void encode(const LookupReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  encode(Verb::Lookup, m, seq, out);
}

void encode(Verb verb, const LookupReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  assert(verb == Verb::Lookup || verb == Verb::Wait);
  frame(reply(verb), 0, seq, out, [&](Writer& w) {
    w.put(m.lease_id);
    w.put(m.restorable_tokens);
    w.put(m.reuse_kind);
    w.put(uint8_t{0});
    w.put(uint16_t{0});
    w.put(m.host_blocks);
    w.put(m.inflight_tokens);
    w.put(m.capture_hint_tokens);
    w.put(static_cast<uint32_t>(m.block_offsets.size()));
    w.put(static_cast<uint32_t>(m.snapshots.size()));
    assert(m.block_checksums.size() == m.block_offsets.size());
    w.put_array(m.block_offsets);
    w.put_array(m.block_checksums);
    for (const SnapshotCandidate& c : m.snapshots) {
      w.put(c.extent_offset);
      w.put(c.position);
      w.put(c.anchor_chunks);
      w.put(c.reuse_kind);
      w.put(c.ready);
      w.put(uint32_t{0});
      w.put(c.payload_checksum);
    }
  });
}

Status decode(std::span<const uint8_t> body, LookupReply& m) {
  Reader r(body);
  uint8_t pad8 = 0;
  uint16_t pad16 = 0;
  uint32_t blocks = 0, snapshots = 0;
  bool ok = r.get(m.lease_id) && r.get(m.restorable_tokens) && r.get(m.reuse_kind) &&
            m.reuse_kind <= reuse_kind_max && r.get(pad8) && r.get(pad16) &&
            r.get(m.host_blocks) && r.get(m.inflight_tokens) && r.get(m.capture_hint_tokens) &&
            r.get(blocks) &&
            r.get(snapshots) && snapshots <= limits::lookup_snapshot_candidates_max &&
            r.get_array(blocks, limits::lookup_chunks_max, m.block_offsets) &&
            r.get_array(blocks, limits::lookup_chunks_max, m.block_checksums);
  ok = ok && m.host_blocks <= m.block_offsets.size();
  m.snapshots.resize(ok ? snapshots : 0);
  for (SnapshotCandidate& c : m.snapshots) {
    uint32_t pad = 1;
    ok = ok && r.get(c.extent_offset) && r.get(c.position) && r.get(c.anchor_chunks) &&
         r.get(c.reuse_kind) && c.reuse_kind <= reuse_kind_max && r.get(c.ready) && c.ready <= 1 &&
         r.get(pad) && pad == 0 && r.get(c.payload_checksum);
  }
  return finish(r, ok);
}

void encode(const ReleaseRequest& m, uint32_t seq, std::vector<uint8_t>& out, Verb verb) {
  assert(verb == Verb::Release || verb == Verb::ReleaseOneWay);
  frame(request(verb), 0, seq, out, [&](Writer& w) {
    w.put(m.lease_id);
    w.put(m.restored_tokens);
  });
}

// Protocol 2 ends after lease_id; 3 adds restored_tokens.
Status decode(std::span<const uint8_t> body, ReleaseRequest& m) {
  Reader r(body);
  m.restored_tokens = 0;
  if (body.size() == sizeof m.lease_id) return finish(r, r.get(m.lease_id));
  return finish(r, r.get(m.lease_id) && r.get(m.restored_tokens));
}

void encode(const WaitRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(request(Verb::Wait), 0, seq, out, [&](Writer& w) {
    w.put(m.lease_id);
    w.put(m.timeout_msec);
    w.put(uint32_t{0});
  });
}

Status decode(std::span<const uint8_t> body, WaitRequest& m) {
  Reader r(body);
  uint32_t pad = 1;
  return finish(r, r.get(m.lease_id) && r.get(m.timeout_msec) && r.get(pad) && pad == 0);
}

void encode(const ReserveBlocksRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(request(Verb::ReserveBlocks), 0, seq, out, [&](Writer& w) {
    put_options(w, m.options);
    w.put(m.first_chunk);
    w.put(m.parent_hash);
    w.put(static_cast<uint32_t>(m.chunk_hashes.size()));
    w.put_array(m.chunk_hashes);
  });
}

Status decode(std::span<const uint8_t> body, ReserveBlocksRequest& m) {
  Reader r(body);
  uint32_t count = 0;
  bool ok = get_options(r, m.options) && r.get(m.first_chunk) && r.get(m.parent_hash) &&
            r.get(count) && r.get_array(count, limits::reserve_blocks_max, m.chunk_hashes);
  return finish(r, ok);
}

void encode(const ReserveBlocksReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(reply(Verb::ReserveBlocks), 0, seq, out, [&](Writer& w) {
    w.put(m.reservation_id);
    w.put(static_cast<uint32_t>(m.grants.size()));
    for (const BlockGrant& g : m.grants) {
      w.put(g.extent_offset);
      w.put(g.disposition);
    }
  });
}

Status decode(std::span<const uint8_t> body, ReserveBlocksReply& m) {
  Reader r(body);
  uint32_t count = 0;
  bool ok = r.get(m.reservation_id) && r.get(count) && count <= limits::reserve_blocks_max;
  m.grants.resize(ok ? count : 0);
  for (BlockGrant& g : m.grants) {
    ok = ok && r.get(g.extent_offset) && r.get(g.disposition) && g.disposition <= 2;
  }
  return finish(r, ok);
}

void encode(const ReserveSnapshotRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(request(Verb::ReserveSnapshot), 0, seq, out, [&](Writer& w) {
    put_options(w, m.options);
    w.put(m.anchor_chunks);
    w.put(m.anchor_hash);
    w.put(m.payload_bytes);
    w.put(static_cast<uint32_t>(m.tail_tokens.size()));
    w.put_array(m.tail_tokens);
  });
}

Status decode(std::span<const uint8_t> body, ReserveSnapshotRequest& m) {
  Reader r(body);
  uint32_t tail = 0;
  bool ok = get_options(r, m.options) && r.get(m.anchor_chunks) && r.get(m.anchor_hash) &&
            r.get(m.payload_bytes) && r.get(tail) &&
            r.get_array(tail, limits::block_tokens_max, m.tail_tokens);
  return finish(r, ok);
}

void encode(const ReserveSnapshotReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(reply(Verb::ReserveSnapshot), 0, seq, out, [&](Writer& w) {
    w.put(m.reservation_id);
    w.put(m.extent_offset);
    w.put(m.extent_bytes);
    w.put(m.payload_offset);
    w.put(m.disposition);
  });
}

Status decode(std::span<const uint8_t> body, ReserveSnapshotReply& m) {
  Reader r(body);
  bool ok = r.get(m.reservation_id) && r.get(m.extent_offset) && r.get(m.extent_bytes) &&
            r.get(m.payload_offset) && r.get(m.disposition) && m.disposition <= 2;
  return finish(r, ok);
}

void encode(Verb verb, const ReservationRequest& m, uint32_t seq, std::vector<uint8_t>& out) {
  assert(verb == Verb::Seal || verb == Verb::Abort);
  frame(request(verb), 0, seq, out, [&](Writer& w) {
    w.put(m.reservation_id);
    w.put(static_cast<uint32_t>(m.payload_checksums.size()));
    w.put(uint32_t{0});
    w.put_array(m.payload_checksums);
  });
}

Status decode(std::span<const uint8_t> body, ReservationRequest& m) {
  Reader r(body);
  uint32_t count = 0, pad = 1;
  bool ok = r.get(m.reservation_id) && r.get(count) && r.get(pad) && pad == 0 &&
            r.get_array(count, limits::reserve_blocks_max, m.payload_checksums);
  return finish(r, ok);
}

void encode(const CorruptReport& m, uint32_t seq, std::vector<uint8_t>& out) {
  frame(request(Verb::ReportCorrupt), 0, seq, out, [&](Writer& w) {
    w.put(m.lease_id);
    w.put(m.extent_offset);
  });
}

Status decode(std::span<const uint8_t> body, CorruptReport& m) {
  Reader r(body);
  return finish(r, r.get(m.lease_id) && r.get(m.extent_offset));
}

void encode(const StatsReply& m, uint32_t seq, std::vector<uint8_t>& out) {
  static_assert(sizeof(StatsReply) % 8 == 0 && std::is_trivially_copyable_v<StatsReply>);
  frame(reply(Verb::Stats), 0, seq, out, [&](Writer& w) { w.put(m); });
}

Status decode(std::span<const uint8_t> body, StatsReply& m) {
  Reader r(body);
  return finish(r, r.get(m));
}

Status decode_header(std::span<const uint8_t> message, FrameHeader& h,
                     std::span<const uint8_t>& ret_body) {
  if (message.size() < frame_header_bytes || message.size() > limits::frame_bytes_max) {
    return Status::ProtocolError;
  }
  Reader r(message.first(frame_header_bytes));
  FrameHeader header;
  bool ok = r.get(header.verb) && r.get(header.status) && r.get(header.sequence) &&
            r.get(header.body_bytes) && r.get(header.reserved);
  const uint16_t verb = header.verb & ~reply_bit;
  if (!ok || header.reserved != 0 || verb == 0 || verb > verb_max ||
      !status_is_known(header.status) ||
      header.body_bytes != message.size() - frame_header_bytes) {
    return Status::ProtocolError;
  }
  h = header;
  ret_body = message.subspan(frame_header_bytes);
  return Status::Ok;
}

}  // namespace kvpark::wire
