/* libkvpark: park and restore LLM inference state through kvparkd.
 *
 * An engine connects once per namespace (model + KV layout), then for each
 * request: kvpark_lookup() the prompt, copy the plan's blocks (and snapshot)
 * out of shared memory, prefill the rest, and kvpark_reserve_blocks() /
 * kvpark_seal() what it computed. Payload bytes never cross the socket: the
 * pointers returned here point into the daemon's shared-memory arena.
 *
 * Lifetimes: a plan's pointers stay valid until kvpark_plan_release(); a
 * reservation's pointers are writable until kvpark_seal() or kvpark_abort(). A
 * crashed engine loses nothing parked: the daemon aborts its reservations and
 * drops its leases.
 *
 * Verified restores: every sealed payload has a checksum (XXH3-64) that the
 * daemon keeps where no client can write it. kvpark_plan_copy_block() and
 * kvpark_plan_copy_snapshot() copy and verify in one pass: the bytes they hand
 * over are the bytes that were sealed, or the call fails with KVPARK_CORRUPT, the
 * entry is dropped by the daemon and the plan shrinks to what is still good.
 * The pointer accessors (kvpark_plan_block(), kvpark_plan_snapshot()) verify the
 * payload in place when called and return NULL when it fails; the bytes stay in
 * shared memory, so only the copy functions guard against a writer that changes
 * them after that check. Publishing through kvpark_reservation_write_block() /
 * kvpark_reservation_write_snapshot() computes the checksum while copying;
 * payloads written through the pointers are checksummed at kvpark_seal().
 *
 * Threads: one kvpark_client may be used from several threads at once; plans
 * and reservations belong to the thread that holds them.
 *
 * Reconnection: when the daemon restarts, the next call reconnects (HELLO again,
 * new arena). Plans and reservations from before stay readable/writable but are
 * no longer known to the daemon: seal then fails with KVPARK_UNAVAILABLE. While
 * such a plan or reservation is open, a daemon that adopted the arena reuses none
 * of the extents it adopted or had reserved until this process exits or a grace
 * passes (the HELLO says so).
 */
#ifndef KVPARK_H
#define KVPARK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVPARK_PROTOCOL_VERSION 4

typedef enum kvpark_status {
  KVPARK_OK = 0,
  KVPARK_NOT_FOUND = 1,
  KVPARK_ALREADY_PRESENT = 2,
  KVPARK_IN_FLIGHT = 3,
  KVPARK_ARENA_FULL = 4,
  KVPARK_LIMIT_EXCEEDED = 5,
  KVPARK_INVALID_ARGUMENT = 6,
  KVPARK_GEOMETRY_MISMATCH = 7,
  KVPARK_PROTOCOL_ERROR = 8,
  KVPARK_UNAVAILABLE = 9, /* daemon not running, or connection lost */
  KVPARK_CORRUPT = 10,
  KVPARK_BAD_STATE = 11,
  KVPARK_PERMISSION_DENIED = 12,
  KVPARK_IO_ERROR = 13,
  KVPARK_TIMEOUT = 14, /* kvpark_plan_wait ran out of time; what is ready stays usable */
  KVPARK_OUT_OF_MEMORY = 15 /* the library could not allocate; no exception leaves a call */
} kvpark_status;

/* A static, human-readable description of a status. */
const char* kvpark_status_string(kvpark_status status);

typedef struct kvpark_hash128 {
  uint64_t low;
  uint64_t high;
} kvpark_hash128;

typedef enum kvpark_reuse_kind {
  KVPARK_REUSE_ROOT = 0,                   /* nothing restorable */
  KVPARK_REUSE_SHARED_STABLE_PREFIX = 1,   /* parked as shared, or by another session */
  KVPARK_REUSE_PRIVATE_TURN_CLOSURE = 2    /* this session's own earlier turn */
} kvpark_reuse_kind;

typedef enum kvpark_entry_class { KVPARK_CLASS_PRIVATE = 0, KVPARK_CLASS_SHARED = 1 } kvpark_entry_class;

typedef enum kvpark_evidence {
  KVPARK_EVIDENCE_DEFAULT_AUTOMATIC = 0,
  KVPARK_EVIDENCE_REQUESTED_AUTOMATIC = 1,
  KVPARK_EVIDENCE_EXPLICIT_BREAKPOINT = 2,
  KVPARK_EVIDENCE_ENGINE_STRUCTURAL = 3,
  KVPARK_EVIDENCE_OBSERVED_RECURRENCE = 4
} kvpark_evidence;

/* What makes KV bytes compatible, and their shape (see kvpark(7)). */
typedef struct kvpark_namespace {
  kvpark_hash128 id;            /* fingerprint: weights, KV dtype/layout, TP rank/size, ... */
  uint32_t block_tokens;        /* tokens per block; 0 = snapshot-only engine */
  uint64_t block_payload_bytes; /* bytes of one block image, all layers; 0 if snapshot-only */
  int snapshot_required;        /* nonzero: a restore needs a state snapshot */
  uint32_t prefill_tokens_per_second; /* the engine's estimate; 0 = unknown */
  const char* client_name;      /* shown to operators; may be NULL */
} kvpark_namespace;

typedef struct kvpark_client kvpark_client;
typedef struct kvpark_plan kvpark_plan;
typedef struct kvpark_reservation kvpark_reservation;

/* Connects and says HELLO. socket_path NULL: $KVPARK_SOCKET or the default path.
 * KVPARK_UNAVAILABLE when no daemon listens there. */
kvpark_status kvpark_connect(const char* socket_path, const kvpark_namespace* ns,
                             kvpark_client** ret_client);
/* As kvpark_connect, with the longest any one reply may take, in milliseconds (0: the
 * default, 30 s; else 1,000 to 600,000). A daemon silent that long (stopped, hung) is
 * taken for gone: the call fails with KVPARK_UNAVAILABLE, and the client's calls in
 * the next 5 s fail at once rather than each waiting as long again; then the next
 * call tries the daemon anew. For a caller that would rather go without kvparkd than
 * wait on it, as kvpark-proxy does. */
kvpark_status kvpark_connect_with_reply_timeout(const char* socket_path, const kvpark_namespace* ns,
                                                uint32_t reply_timeout_msec,
                                                kvpark_client** ret_client);
void kvpark_disconnect(kvpark_client* client);

/* Tokens per hash chunk for this namespace (block_tokens, or 64 if snapshot-only). */
uint32_t kvpark_chain_tokens(const kvpark_client* client);

/* h[i] = XXH3-128(h[i-1] || tokens of chunk i), h[-1] = seed; writes chunks hashes
 * (all zero, a value no chain takes in practice, if the library could not allocate). */
void kvpark_chain_hashes(kvpark_hash128 seed, const int32_t* tokens, uint32_t chunk_tokens,
                         size_t chunks, kvpark_hash128* ret_hashes);

/* Finds the longest restorable prefix of tokens[0, n_tokens). Always succeeds with
 * a plan on KVPARK_OK (restorable 0 on a miss); every block in it has been
 * confirmed against the exact token ids stored beside it. */
kvpark_status kvpark_lookup(kvpark_client* client, uint64_t session_id, const int32_t* tokens,
                            size_t n_tokens, kvpark_plan** ret_plan);
uint32_t kvpark_plan_restorable_tokens(const kvpark_plan* plan);
kvpark_reuse_kind kvpark_plan_reuse_kind(const kvpark_plan* plan);
/* Blocks to copy in, in order: block i covers tokens [i*block_tokens, (i+1)*block_tokens). */
size_t kvpark_plan_block_count(const kvpark_plan* plan);
const void* kvpark_plan_block(const kvpark_plan* plan, size_t index);
/* The snapshot to apply after the blocks, or NULL; its state is at position *ret_position. */
const void* kvpark_plan_snapshot(const kvpark_plan* plan, uint64_t* ret_bytes,
                                 uint32_t* ret_position);
/* Copies block `index` (the namespace's block_payload_bytes) into dst and verifies
 * it in the same pass. KVPARK_CORRUPT: the parked bytes were altered after they
 * were sealed; dst must not be used, the plan now holds only blocks [0, index)
 * (and no snapshot), kvpark_plan_restorable_tokens() says how far that restores,
 * and the engine prefills the rest. KVPARK_INVALID_ARGUMENT: no such block. */
kvpark_status kvpark_plan_copy_block(kvpark_plan* plan, size_t index, void* dst);
/* Copies the plan's snapshot (all kvpark_plan_snapshot() bytes; `bytes` must equal
 * them) into dst, verifying it. KVPARK_CORRUPT: as above; the plan keeps its blocks
 * (restorable unless the namespace needs a snapshot) and drops the snapshot. */
kvpark_status kvpark_plan_copy_snapshot(kvpark_plan* plan, void* dst, uint64_t bytes);
/* The snapshot's size in bytes (0: none) and its position in *ret_position, without
 * reading a byte of it: for an engine that copies it out in parts. */
uint64_t kvpark_plan_snapshot_bytes(const kvpark_plan* plan, uint32_t* ret_position);
/* Copies snapshot bytes [offset, offset + bytes) into dst, verifying as it copies,
 * through the cache (for a staging buffer the caller reads at once; the whole-payload
 * copies store large payloads around it). Parts come in order: offset 0 first (which
 * starts over), then each where the one before ended; anything else is
 * KVPARK_INVALID_ARGUMENT. The part that ends at the snapshot's last byte checks the
 * whole: KVPARK_CORRUPT means no byte of any part may be used, and the plan drops the
 * snapshot as kvpark_plan_copy_snapshot() does. */
kvpark_status kvpark_plan_read_snapshot(kvpark_plan* plan, uint64_t offset, void* dst,
                                        uint64_t bytes);
/* Copies bytes [offset, offset + bytes) of block `index` into dst, verifying as it
 * copies, through the cache (for a staging buffer read at once). Each block is read
 * on its own, in order: offset 0 first (which starts that block over), then each part
 * where that block's last one ended, so a caller may interleave parts of several
 * blocks (kvpark-proxy writes a llama.cpp image layer by layer across blocks). Any
 * other offset is KVPARK_INVALID_ARGUMENT. The part that ends at the block's last
 * byte checks it whole: KVPARK_CORRUPT means no byte of that block's parts may be
 * used, and the plan shrinks as kvpark_plan_copy_block() says. */
kvpark_status kvpark_plan_read_block(kvpark_plan* plan, size_t index, uint64_t offset, void* dst,
                                     uint64_t bytes);
/* Entries parked only on disk are promoted into the arena when a lookup reaches
 * them. kvpark_plan_pending_tokens() is what the plan will restore once those
 * promotions land (equal to kvpark_plan_restorable_tokens() when none are in
 * flight). An engine may use what is ready now and prefill the rest, or wait:
 * kvpark_plan_wait() returns KVPARK_OK when every promotion settled (the plan then
 * describes the new restorable prefix; where what it waited for settled, the plan was
 * looked up again, and what that lookup started, such as the remote store's tail
 * snapshot after its blocks, was waited for too), KVPARK_TIMEOUT when timeout_msec passed
 * first (the plan describes what is ready), or an error such as
 * KVPARK_UNAVAILABLE if the daemon went away. Set timeout_msec from the engine's
 * own prefill estimate so waiting never costs more than prefilling. */
uint32_t kvpark_plan_pending_tokens(const kvpark_plan* plan);
/* Single flight: tokens past the restorable prefix that another engine (any
 * process) is prefilling right now and will publish. An engine with the same
 * prompt should wait for it instead of prefilling the same head twice:
 * kvpark_plan_wait() then returns when that engine sealed or gave up (crash
 * included) and the plan has been looked up again; prefill only what is still
 * missing. The daemon ends such a wait once it has lasted as long as prefilling
 * those tokens at the engine's declared rate would. A long wait is asked for in
 * short WAITs (limits::wait_slice_msec), so other threads' calls on the same client
 * go through meanwhile. timeout_msec is at most 600000 (KVPARK_INVALID_ARGUMENT). */
uint32_t kvpark_plan_inflight_tokens(const kvpark_plan* plan);
/* Recurrence: a position (tokens) that independent sessions share past what is
 * parked; an engine that can should park its state there (evidence
 * KVPARK_EVIDENCE_OBSERVED_RECURRENCE, class shared). 0: no hint. */
uint32_t kvpark_plan_capture_hint(const kvpark_plan* plan);
kvpark_status kvpark_plan_wait(kvpark_plan* plan, uint32_t timeout_msec);
/* Tells the daemon, when the plan is released, how many tokens of it the engine
 * actually restored (0 until set: a plan released unused restored nothing). It
 * counts them as restored, next to what lookups found restorable, capped at what
 * the lease covered. Call once the state is in the engine; a later call replaces
 * the figure. NULL is ignored. */
void kvpark_plan_set_restored_tokens(kvpark_plan* plan, uint32_t tokens);
/* Ends the plan's lease (reporting the restored tokens) and frees it. NULL is ignored. */
void kvpark_plan_release(kvpark_plan* plan);

typedef struct kvpark_publish_options {
  uint64_t session_id;
  kvpark_entry_class entry_class;
  kvpark_evidence evidence;
} kvpark_publish_options;

/* Reserves blocks [first_block, first_block + block_count) of tokens[0, n_tokens),
 * which must cover them. Blocks already parked (or being written by another
 * engine) come back with a NULL pointer: skip them. The token ids are written by
 * the library; the caller writes each non-NULL payload, then seals. */
kvpark_status kvpark_reserve_blocks(kvpark_client* client, const kvpark_publish_options* options,
                                    const int32_t* tokens, size_t n_tokens, size_t first_block,
                                    size_t block_count, kvpark_reservation** ret_reservation);
size_t kvpark_reservation_block_count(const kvpark_reservation* reservation);
void* kvpark_reservation_block(const kvpark_reservation* reservation, size_t index);
/* Copies a block's payload (block_payload_bytes) into reserved block `index` and
 * checksums it in the same pass. KVPARK_INVALID_ARGUMENT for a NULL block. */
kvpark_status kvpark_reservation_write_block(kvpark_reservation* reservation, size_t index,
                                             const void* src);

/* Reserves a snapshot of the state after tokens[0, n_tokens). KVPARK_ALREADY_PRESENT
 * or KVPARK_IN_FLIGHT (and no reservation) when it needs no writing. */
kvpark_status kvpark_reserve_snapshot(kvpark_client* client, const kvpark_publish_options* options,
                                      const int32_t* tokens, size_t n_tokens,
                                      uint64_t payload_bytes,
                                      kvpark_reservation** ret_reservation);
void* kvpark_reservation_snapshot(const kvpark_reservation* reservation);
/* Copies `bytes` of src to the snapshot payload at `offset`, checksumming as it
 * goes. Written in order from offset 0, the checksum costs no extra pass; any
 * other order is checksummed again at kvpark_seal(). */
kvpark_status kvpark_reservation_write_snapshot(kvpark_reservation* reservation, uint64_t offset,
                                                const void* src, uint64_t bytes);

/* Makes the written entries visible; frees the reservation whatever the result. */
kvpark_status kvpark_seal(kvpark_reservation* reservation);
/* Discards the reservation and frees it. */
kvpark_status kvpark_abort(kvpark_reservation* reservation);

typedef struct kvpark_stats {
  uint64_t arena_data_bytes;
  uint64_t arena_free_bytes;
  uint64_t arena_largest_free_bytes;
  uint64_t blocks;
  uint64_t snapshots;
  uint64_t namespaces;
  uint64_t connections;
  uint64_t leases;
  uint64_t reservations;
  uint64_t lookups;
  uint64_t lookup_hit_tokens;
  uint64_t evictions;
  uint64_t dedup_hits;
  uint64_t protocol_errors;
  uint64_t disk_entries;      /* entries with a disk copy */
  uint64_t disk_bytes;
  uint64_t spills;            /* host -> disk writes completed */
  uint64_t spill_failures;
  uint64_t promotions;        /* disk -> host restores completed */
  uint64_t checksum_failures; /* disk records refused: never served */
  uint64_t corrupt_payloads;  /* host payloads found altered at restore: dropped */
  uint64_t arena_pages;       /* 0: 4 KiB pages, 1: transparent huge pages, 2: hugetlb */
  uint64_t arena_page_bytes;  /* page size backing the arena */
} kvpark_stats;

kvpark_status kvpark_get_stats(kvpark_client* client, kvpark_stats* ret_stats);

#ifdef __cplusplus
}
#endif

#endif /* KVPARK_H */
