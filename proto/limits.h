// Every limit kvpark enforces, in one place, with its unit last.
//
// Everything a client controls has a cap here: connections, leases, reservations,
// tokens per lookup, frame size. The daemon checks each one and answers with
// Status::LimitExceeded; tests exercise each at N and N+1.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvpark::limits {

// Wire protocol.
inline constexpr uint16_t protocol_version = 1;
// One SOCK_SEQPACKET message. Must fit the default unix socket send buffer
// (net.core.wmem_default = 212992 bytes) so no client needs privileged tuning.
inline constexpr size_t frame_bytes_max = 160 * 1024;
inline constexpr size_t client_name_bytes_max = 64;

// Hash chunks per LOOKUP (16 bytes each on the wire). 8192 chunks of 16 tokens
// cover a 128k-token prompt with the smallest page size engines use.
inline constexpr size_t lookup_chunks_max = 8192;
inline constexpr size_t lookup_tokens_max = 1024 * 1024;
// Snapshot candidates returned by one LOOKUP; the client confirms their tails.
inline constexpr size_t lookup_snapshot_candidates_max = 8;

// Namespace geometry.
inline constexpr uint32_t block_tokens_max = 4096;
// Hash granularity of snapshot-only namespaces (block_tokens == 0).
inline constexpr uint32_t snapshot_chain_tokens = 64;
inline constexpr uint64_t block_payload_bytes_max = 256ull * 1024 * 1024;
inline constexpr uint64_t snapshot_payload_bytes_max = 64ull * 1024 * 1024 * 1024;

// Namespaces, all connections: registered at HELLO (or disk recovery) and kept while
// the daemon runs, so a client could otherwise grow the table without bound. A host
// serves a few models, each with a few layouts and tensor-parallel ranks.
inline constexpr size_t namespaces_max = 1024;

// Per connection.
inline constexpr size_t connections_max = 256;
inline constexpr size_t leases_per_connection_max = 1024;
inline constexpr size_t reservations_per_connection_max = 256;
inline constexpr size_t reserve_blocks_max = 1024;  // blocks in one RESERVE

// Waits and recurrence, all connections.
inline constexpr uint32_t wait_timeout_msec_max = 600'000;  // one WAIT
inline constexpr size_t waits_max = 1024;                   // pending WAITs
// Chunk hashes remembered from lookups past their restorable prefix (a ring).
inline constexpr size_t recurrence_chunks_max = 65536;

// Arena.
inline constexpr size_t arena_header_bytes = 4096;  // one page, mapped read-only by clients
inline constexpr size_t extent_align_bytes = 4096;  // O_DIRECT and page granularity
inline constexpr size_t entry_header_bytes = 256;   // entry header + padding
// Payloads start on a page: engines copy whole payloads, and a destination 512 bytes
// into a page made memcpy ~20% slower than a page-aligned one (kvpark-bench).
inline constexpr size_t payload_align_bytes = 4096;
inline constexpr uint64_t arena_bytes_min = 16ull * 1024 * 1024;
inline constexpr uint64_t arena_bytes_default = 1024ull * 1024 * 1024;

static_assert(frame_bytes_max >= 64 + lookup_chunks_max * 16,
              "a LOOKUP of lookup_chunks_max hashes must fit one frame");
static_assert(frame_bytes_max >= 64 + reserve_blocks_max * (16 + 8),
              "a RESERVE reply of reserve_blocks_max extents must fit one frame");
static_assert(extent_align_bytes % payload_align_bytes == 0);
static_assert(arena_header_bytes % extent_align_bytes == 0,
              "the data region must start O_DIRECT-aligned");
static_assert(block_tokens_max * 4 <= 64 * 1024, "a block's token ids stay small");

}  // namespace kvpark::limits
