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
// and LOOKUP replies return them; REPORT_CORRUPT; RESERVE names the parent of its
// first block (the disk tier keeps chains whole).
// 3: RELEASE carries the tokens the client restored from the lease (a v2 RELEASE,
// without them, still decodes: nothing reported restored).
// 4: HELLO says whether the client still holds plans or reservations made on an earlier
// connection (a daemon that adopted the arena keeps that engine's adopted extents held).
inline constexpr uint16_t protocol_version = 4;
// The oldest client protocol the daemon still greets.
inline constexpr uint16_t protocol_version_min = 2;
static_assert(protocol_version_min <= protocol_version);
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

// Connection admission. One uid, or one process, cannot take every slot: a peer
// that connects and never says HELLO is closed after hello_timeout_usec, and a uid
// past its share is refused at accept (LimitExceeded) while other users still get in.
inline constexpr size_t connections_max = 256;
inline constexpr size_t connections_per_uid_max = 128;
inline constexpr size_t connections_per_process_max = 64;
inline constexpr uint64_t hello_timeout_usec = 2'000'000;
static_assert(connections_per_uid_max < connections_max,
              "another user must still find a free slot when one uid holds its share");
static_assert(connections_per_process_max <= connections_per_uid_max);

// Per connection.
inline constexpr size_t leases_per_connection_max = 1024;
inline constexpr size_t reservations_per_connection_max = 256;
// Unsealed state, by bytes: a connection may hold at most 1/unsealed_connection_share
// of the arena reserved and not sealed, a uid at most 1/unsealed_uid_share (kvparkd's
// unsealed_per_connection and unsealed_per_uid set other sizes), so one runaway engine
// cannot take the arena from every other. What is counted is what one holds beyond a
// reservation of its own: a single reservation is bounded by reservation_max alone.
// A reservation unsealed this long is aborted (a stuck engine gives its space back):
// longer than any prefill a reservation waits out (kvpark-proxy reserves a head before
// prefilling it), as long as the longest WAIT.
inline constexpr uint64_t unsealed_connection_share = 4;
inline constexpr uint64_t unsealed_uid_share = 2;
inline constexpr uint64_t unsealed_deadline_usec = 600'000'000;
inline constexpr size_t reserve_blocks_max = 1024;  // blocks in one RESERVE

// Waits and recurrence, all connections.
inline constexpr uint32_t wait_timeout_msec_max = 600'000;  // one WAIT
// libkvpark asks for a long wait in WAITs of at most this long: a WAIT holds the
// connection, whose other users' requests go between them, and no reply may take as
// long as the client's reply timeout (a silent daemon is taken for gone).
inline constexpr uint32_t wait_slice_msec = 200;
inline constexpr size_t waits_max = 1024;                   // pending WAITs
// Pending WAITs of one connection. libkvpark has one request in flight per client;
// a peer that pipelines more must not take every slot from the rest.
inline constexpr size_t waits_per_connection_max = 16;
static_assert(waits_per_connection_max < waits_max);
// Chunk hashes remembered from lookups past their restorable prefix (a ring).
inline constexpr size_t recurrence_chunks_max = 65536;

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
// Copies into or out of the arena at least this large store around the cache
// (client/copy_xxh3.h): a cached store reads its line from memory first, and the
// bytes are not read again by the copier. Smaller copies keep the destination
// in cache for the engine that reads it next.
inline constexpr size_t streaming_copy_min_bytes = 64 * 1024;
// Copies through a client's mapping at least this large fill the page tables of the
// regions they touch first (shm::ArenaMapping::prefault): smaller ones take their
// few faults, and a region once filled stays filled for the mapping's life.
inline constexpr uint64_t prefault_min_bytes = 1024 * 1024;

// A daemon that adopted the arena of the one before it (systemd's fd store) reuses no
// adopted extent while a lease of that daemon may still be read: until every engine it
// had connected said HELLO again or exited, or this long after the start. A client
// copies the largest snapshot (64 GiB) out of the arena in well under this at the
// memory bandwidth of the machines kvpark serves (~10 GB/s).
inline constexpr uint64_t adopted_lease_grace_usec = 30'000'000;

// HTTP listeners (kvparkd's status and metrics, kvpark-proxy's front): a peer must
// send its whole request head within http_head_timeout_usec and its body within
// http_body_timeout_usec, or it is closed; workers only ever see complete requests.
inline constexpr uint64_t http_head_timeout_usec = 5'000'000;
inline constexpr uint64_t http_body_timeout_usec = 30'000'000;
inline constexpr size_t http_head_bytes_max = 16 * 1024;
// A worker waits this long for room to write its response (a client not reading).
inline constexpr uint64_t http_write_timeout_usec = 5'000'000;
inline constexpr size_t http_connections_max = 256;          // connections held, all peers
inline constexpr size_t http_connections_per_peer_max = 16;  // from one peer address
static_assert(http_connections_per_peer_max < http_connections_max);
// The disk tier's "written today" (the daily write budget's count) is saved to its
// directory at most this often while it changes, and at a clean stop: a crash forgets
// at most this much of the day's writes.
inline constexpr uint64_t disk_budget_save_interval_usec = 5'000'000;
// kvparkd's /health waits this long for the event loop to answer; past it the loop is
// stuck (503 "not ready"), which a probe must learn from the answer, not a hang.
inline constexpr uint64_t health_loop_timeout_usec = 1'000'000;
// kvparkd's API is read-only: a request body is never needed.
inline constexpr size_t http_status_body_bytes_max = 4 * 1024;
// kvpark-proxy forwards chat requests: a 1 Mi-token prompt of JSON fits.
inline constexpr size_t http_proxy_body_bytes_max = 64ull * 1024 * 1024;
// kvpark-proxy remembers the token ids of conversation prefixes it rendered (heads,
// turn closures), per upstream, so a request continuing one is forwarded without
// rendering or tokenizing first: 8 Mi tokens (32 MiB) of them, oldest dropped first.
inline constexpr size_t proxy_prefix_cache_tokens_max = 8 * 1024 * 1024;
// Its clients are agent harnesses on the same machine, fanning out in parallel from one
// address: room for every request it serves at once (64) and as many arriving.
inline constexpr size_t http_proxy_connections_per_peer_max = 128;
static_assert(http_proxy_connections_per_peer_max < http_connections_max);

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
