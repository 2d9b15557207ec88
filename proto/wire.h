// The kvparkd wire protocol: one request or reply per SOCK_SEQPACKET message.
//
// Every message is a FrameHeader followed by body_bytes of body; integers are
// little-endian, fields packed in declaration order (see wire.cpp). A decoder
// never trusts a length: counts are checked against the bytes actually present
// before anything is allocated, and trailing bytes are an error. A frame that
// fails to decode is a ProtocolError and the daemon closes that connection.
// Payload bytes never travel here; they live in the shared-memory arena.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "proto/status.h"
#include "proto/types.h"

namespace kvpark::wire {

enum class Verb : uint16_t {
  Hello = 1,
  Lookup = 2,
  Release = 3,
  ReserveBlocks = 4,
  ReserveSnapshot = 5,
  Seal = 6,
  Abort = 7,
  Stats = 8,
  Wait = 9,  // for a lease's disk promotions; the reply is a LookupReply
  ReleaseOneWay = 10,  // RELEASE without a reply: saves the engine a round trip
  ReportCorrupt = 11,  // one way: a leased entry's payload failed its checksum
};
inline constexpr uint16_t verb_max = 11;

struct FrameHeader {
  uint16_t verb = 0;
  uint16_t status = 0;  // replies only; requests send 0
  uint32_t sequence = 0;
  uint32_t body_bytes = 0;
  uint32_t reserved = 0;
};
inline constexpr size_t frame_header_bytes = 16;

struct HelloRequest {
  uint16_t protocol_version = 0;
  NamespaceId namespace_id;
  Geometry geometry;
  uint32_t prefill_tokens_per_second = 0;  // engine's own estimate; 0 = unknown
  // Plans or reservations made on an earlier connection are still open (a reconnection
  // after a daemon restart): leases of the previous instance may still be read, and
  // its reserved extents written (protocol 4).
  bool holds_earlier_grants = false;
  std::string client_name;
};
struct HelloReply {
  uint64_t data_bytes = 0;  // the arena's data object (the header object is one page)
  uint64_t incarnation = 0;
  uint32_t connection_id = 0;
  uint32_t chain_tokens = 0;          // tokens per hash chunk for this namespace
  uint64_t block_extent_bytes = 0;    // arena bytes one block occupies
  uint32_t block_payload_offset = 0;  // payload start inside a block extent
  uint32_t reserved = 0;
};

struct LookupRequest {
  uint64_t session_id = 0;
  uint32_t prompt_tokens = 0;
  std::vector<Hash128> chunk_hashes;  // h[0..n) over whole chunks
  std::vector<int32_t> tail_tokens;   // the tokens after the last whole chunk
};
struct SnapshotCandidate {
  uint64_t extent_offset = 0;  // from the data region start
  uint32_t position = 0;       // tokens restored if this snapshot is used
  uint32_t anchor_chunks = 0;  // whole chunks before its tail
  uint32_t reuse_kind = 0;     // ReuseKind if this snapshot is used
  uint32_t ready = 0;          // 1: readable now; 0: being promoted from disk (WAIT)
  uint64_t payload_checksum = 0;  // XXH3-64 of the payload, from daemon-private memory
};
struct LookupReply {
  uint64_t lease_id = 0;            // 0: nothing leased
  uint32_t restorable_tokens = 0;   // through blocks alone; snapshots may extend it
  uint8_t reuse_kind = 0;           // ReuseKind of the block prefix
  uint32_t host_blocks = 0;         // blocks [0, host_blocks) are readable now; the rest
                                    // are being promoted from disk (WAIT for them)
  uint32_t inflight_tokens = 0;     // past the restorable prefix, tokens another engine is
                                    // prefilling right now (single flight: WAIT, then LOOKUP)
  uint32_t capture_hint_tokens = 0; // a position independent sessions share: park state there
  std::vector<uint64_t> block_offsets;  // extents of blocks 0..k-1, data-region offsets
  std::vector<uint64_t> block_checksums;  // XXH3-64 of each block's payload (same count)
  std::vector<SnapshotCandidate> snapshots;  // deepest first; the client confirms tails
};

struct ReleaseRequest {
  uint64_t lease_id = 0;
  // Tokens the client restored from the lease's entries (0: none, or a v2 client,
  // whose RELEASE ends after lease_id). The daemon counts at most what it leased.
  uint32_t restored_tokens = 0;
};

struct WaitRequest {
  uint64_t lease_id = 0;
  uint32_t timeout_msec = 0;
};

struct PublishOptions {
  uint64_t session_id = 0;
  uint8_t entry_class = 0;  // EntryClass
  uint8_t evidence = 0;     // Evidence
};

struct ReserveBlocksRequest {
  PublishOptions options;
  uint32_t first_chunk = 0;  // chain index of chunk_hashes[0]
  Hash128 parent_hash;       // h[first_chunk-1], or the namespace seed when 0
  std::vector<Hash128> chunk_hashes;
};
enum class Disposition : uint32_t { Reserved = 0, Present = 1, InFlight = 2 };
struct BlockGrant {
  uint64_t extent_offset = 0;  // valid when disposition == Reserved
  uint32_t disposition = 0;
};
struct ReserveBlocksReply {
  uint64_t reservation_id = 0;  // 0: nothing reserved
  std::vector<BlockGrant> grants;
};

struct ReserveSnapshotRequest {
  PublishOptions options;
  uint32_t anchor_chunks = 0;
  Hash128 anchor_hash;  // h[anchor_chunks-1], or the namespace seed when 0
  uint64_t payload_bytes = 0;
  std::vector<int32_t> tail_tokens;
};
struct ReserveSnapshotReply {
  uint64_t reservation_id = 0;
  uint64_t extent_offset = 0;
  uint64_t extent_bytes = 0;
  uint32_t payload_offset = 0;
  uint32_t disposition = 0;
};

struct ReservationRequest {  // SEAL and ABORT
  uint64_t reservation_id = 0;
  // SEAL: XXH3-64 of each reserved payload, in grant order (Reserved grants only);
  // the daemon keeps them where no client can write. ABORT: empty.
  std::vector<uint64_t> payload_checksums;
};

struct CorruptReport {  // REPORT_CORRUPT, one way
  uint64_t lease_id = 0;
  uint64_t extent_offset = 0;  // of the leased entry whose payload failed its checksum
};

struct StatsReply {
  uint64_t arena_data_bytes = 0;
  uint64_t arena_free_bytes = 0;
  uint64_t arena_largest_free_bytes = 0;
  uint64_t blocks = 0;
  uint64_t snapshots = 0;
  uint64_t namespaces = 0;
  uint64_t connections = 0;
  uint64_t leases = 0;
  uint64_t reservations = 0;
  uint64_t lookups = 0;
  uint64_t lookup_hit_tokens = 0;
  uint64_t evictions = 0;
  uint64_t dedup_hits = 0;  // reserves answered Present
  uint64_t protocol_errors = 0;
  // Disk tier (zero without one).
  uint64_t disk_entries = 0;        // entries with a disk copy
  uint64_t disk_bytes = 0;
  uint64_t spills = 0;              // completed
  uint64_t spill_failures = 0;
  uint64_t promotions = 0;          // disk -> host, completed
  uint64_t checksum_failures = 0;   // records refused on read
  uint64_t corrupt_payloads = 0;    // host payloads that failed their checksum at restore
  uint64_t arena_pages = 0;         // what backs the arena: 0 4 KiB, 1 transparent huge, 2 hugetlb
  uint64_t arena_page_bytes = 0;
};

// Encoding appends one whole message (header + body) to `out`.
void encode(uint16_t verb, uint16_t status, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const HelloRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const HelloReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const LookupRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const LookupReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const ReleaseRequest& msg, uint32_t sequence, std::vector<uint8_t>& out,
            Verb verb = Verb::Release);
void encode(const WaitRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
// A LookupReply sent as the answer to `verb` (Lookup or Wait).
void encode(wire::Verb verb, const LookupReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const ReserveBlocksRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const ReserveBlocksReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const ReserveSnapshotRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const ReserveSnapshotReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(Verb verb, const ReservationRequest& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const StatsReply& msg, uint32_t sequence, std::vector<uint8_t>& out);
void encode(const CorruptReport& msg, uint32_t sequence, std::vector<uint8_t>& out);

// Splits a received message into header and body; checks sizes and the verb range.
Status decode_header(std::span<const uint8_t> message, FrameHeader& ret_header,
                     std::span<const uint8_t>& ret_body);

// Each decoder consumes the whole body or fails with ProtocolError.
Status decode(std::span<const uint8_t> body, HelloRequest& ret);
Status decode(std::span<const uint8_t> body, HelloReply& ret);
Status decode(std::span<const uint8_t> body, LookupRequest& ret);
Status decode(std::span<const uint8_t> body, LookupReply& ret);
Status decode(std::span<const uint8_t> body, ReleaseRequest& ret);
Status decode(std::span<const uint8_t> body, WaitRequest& ret);
Status decode(std::span<const uint8_t> body, ReserveBlocksRequest& ret);
Status decode(std::span<const uint8_t> body, ReserveBlocksReply& ret);
Status decode(std::span<const uint8_t> body, ReserveSnapshotRequest& ret);
Status decode(std::span<const uint8_t> body, ReserveSnapshotReply& ret);
Status decode(std::span<const uint8_t> body, ReservationRequest& ret);
Status decode(std::span<const uint8_t> body, StatsReply& ret);
Status decode(std::span<const uint8_t> body, CorruptReport& ret);

// Reply verbs are the request verb with this bit set.
inline constexpr uint16_t reply_bit = 0x8000;

}  // namespace kvpark::wire
