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
// 2: the arena is two sealed memfds (header, data); SEAL carries payload checksums
// and LOOKUP replies return them; REPORT_CORRUPT.
inline constexpr uint16_t protocol_version = 2;
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

// Per connection.
inline constexpr size_t connections_max = 256;
inline constexpr size_t leases_per_connection_max = 1024;
inline constexpr size_t reservations_per_connection_max = 256;
inline constexpr size_t reserve_blocks_max = 1024;  // blocks in one RESERVE

// Arena.
inline constexpr size_t arena_header_bytes = 4096;  // the header object: one page, sealed against writes
inline constexpr size_t extent_align_bytes = 4096;  // O_DIRECT and page granularity
inline constexpr size_t entry_header_bytes = 256;   // entry header + padding
// Payloads start on a page: engines copy whole payloads, and a destination 512 bytes
// into a page made memcpy ~20% slower than a page-aligned one (kvpark-bench).
inline constexpr size_t payload_align_bytes = 4096;
inline constexpr uint64_t arena_bytes_min = 16ull * 1024 * 1024;
inline constexpr uint64_t arena_bytes_default = 1024ull * 1024 * 1024;
inline constexpr size_t arena_name_bytes_max = 200;  // memfd names: the kernel allows 249
// Fused copy-and-checksum works in pieces this size: the piece just copied is hashed
// while it is still in the L1/L2 cache, so verifying costs no second pass over memory.
inline constexpr size_t checksum_piece_bytes = 16 * 1024;

static_assert(frame_bytes_max >= 64 + lookup_chunks_max * 16,
              "a LOOKUP of lookup_chunks_max hashes must fit one frame");
static_assert(frame_bytes_max >= 64 + lookup_chunks_max * (8 + 8) + lookup_snapshot_candidates_max * 32,
              "a LOOKUP reply of lookup_chunks_max extents and checksums must fit one frame");
static_assert(frame_bytes_max >= 64 + reserve_blocks_max * (16 + 8),
              "a RESERVE reply of reserve_blocks_max extents must fit one frame");
static_assert(extent_align_bytes % payload_align_bytes == 0);
static_assert(arena_header_bytes % extent_align_bytes == 0,
              "the header object is whole pages, so it can be mapped and sealed alone");
static_assert(block_tokens_max * 4 <= 64 * 1024, "a block's token ids stay small");

}  // namespace kvpark::limits
