// Limits of the remote tier, each with its unit last.
//
// Kept beside the library (like iouring/disk_limits.h): nothing on the engine wire
// depends on them. A record written with a larger chunk or more chunks than these
// is refused by every reader (a miss), so they are part of the record format.
#pragma once

#include <cstdint>

#include "proto/limits.h"

namespace kvpark::remote {

// One value (key) of an entry's image: what one GET moves. Redis' own cap on a bulk
// string is 512 MiB; a few MiB keeps one node's reply from monopolising its link and
// bounds what a reader buffers per chunk.
//
// The default sits just under 4 MiB: Redis keeps a value in one jemalloc allocation
// of its bytes plus an sds header, and a value of exactly 4 MiB lands in the 5 MiB
// size class (MEMORY USAGE: 5242936 bytes), a quarter of the store wasted;
// 4 MiB - 64 bytes costs 4194360.
inline constexpr uint32_t chunk_bytes_default = (4u << 20) - 64;
inline constexpr uint32_t chunk_bytes_max = 8u << 20;
inline constexpr uint32_t chunk_bytes_min = 4096;
// Chunks of one entry: 4096 x 8 MiB = 32 GiB, past any snapshot a home rig parks.
inline constexpr uint32_t chunks_per_entry_max = 4096;
// A manifest: its fixed header plus one checksum per chunk.
inline constexpr uint32_t manifest_bytes_max = 256 + 8 * chunks_per_entry_max;

// Chunk GETs in flight per entry restore (pipelined): bounds what is buffered,
// chunks_in_flight_max x chunk_bytes_max.
inline constexpr uint32_t chunks_in_flight_max = 1;
// Restores of small entries (one chunk of at most batched_get_entry_bytes_max) are
// pipelined: up to batched_gets_max of them, batched_get_bytes_max in all, in one
// round trip. Larger entries stream chunk by chunk (chunks_in_flight_max). Measured on
// loopback with hiredis 0.14 (docs/remote.md): 256 GETs of 16 KiB took 13.8 ms one at a
// time and 2.4-2.9 ms pipelined 32-96 at a time, but 22-37 ms once a batch's replies
// passed about 2 MiB; so a batch stays well under that.
inline constexpr uint64_t batched_get_entry_bytes_max = 256u << 10;
inline constexpr uint64_t batched_get_bytes_max = 512u << 10;
inline constexpr uint32_t batched_gets_max = 64;
// Keys one existence check asks for at once (a 1 Mi-token prompt of 64-token blocks).
inline constexpr uint32_t probe_keys_max = 16384;

// An anchor's snapshot index: fields one lookup considers (a store that holds more
// serves the first ones it returns), and the tail a field's value may hold (longer
// than any namespace's chunk: proto/limits.h).
inline constexpr uint32_t index_fields_max = 64;
inline constexpr uint32_t index_tail_tokens_max = 4096;

// Redirections (MOVED / ASK) followed for one command before it counts as a miss.
inline constexpr uint32_t redirects_max = 5;
// Nodes the client keeps connections to (seeds plus what CLUSTER SLOTS names).
inline constexpr uint32_t nodes_max = 64;
// Seeds in one `remote =` setting.
inline constexpr uint32_t seeds_max = 16;

// Connect and per-operation socket timeouts: a node that does not answer in this
// time is down (a miss) until the next retry.
inline constexpr uint32_t connect_timeout_msec_default = 200;
inline constexpr uint32_t io_timeout_msec_default = 500;
// A node that failed is retried after a backoff doubling from min to max.
inline constexpr uint64_t retry_backoff_usec_min = 100'000;
inline constexpr uint64_t retry_backoff_usec_max = 5'000'000;

// Redis Cluster's hash-slot space (fixed by the protocol).
inline constexpr uint32_t hash_slots = 16384;

static_assert(chunk_bytes_default <= chunk_bytes_max && chunk_bytes_min <= chunk_bytes_default);
static_assert(index_tail_tokens_max >= limits::block_tokens_max &&
                  index_tail_tokens_max >= limits::snapshot_chain_tokens,
              "a snapshot's tail is shorter than one chunk of any namespace");
static_assert(uint64_t{chunks_in_flight_max} * chunk_bytes_max <= 64ull << 20,
              "a restore buffers at most 64 MiB of replies");

}  // namespace kvpark::remote
