/* libkvpark device API: move parked blocks between the arena and an engine's
 * paged KV cache (docs/kernels.md, "Device API").
 *
 * An engine describes its paged KV cache once (kvpark_kv_cache) and attaches it
 * to a connected client (kvpark_device_attach). Then, per request:
 *   restore: kvpark_lookup() -> kvpark_device_restore(plan, page table, ...)
 *            -> wait -> kvpark_plan_release();
 *   park:    kvpark_reserve_blocks() -> kvpark_device_park(reservation, ...)
 *            -> wait -> kvpark_seal().
 * Both are asynchronous and return a kvpark_transfer, a completion to wait on.
 *
 * Two paths, chosen at attach by kv_cache.memory:
 *   HOST (CPU engines): the copies run on the device's worker thread, one
 *     transfer at a time in submission order; the call only validates and
 *     queues, so the engine overlaps its own work with the copy.
 *   CUDA: the copies are kernel launches on the attached stream; the kernel
 *     reads and writes the arena directly (it is registered with
 *     cudaHostRegister, mapped, once per arena mapping). A transfer records a
 *     cudaEvent; the engine may instead order its own work after the transfer
 *     on the same stream (or wait for kvpark_transfer_event on another).
 *
 * Layer-by-layer restore: with KVPARK_TRANSFER_LAYERWISE, a restore signals each
 * layer as it lands, in increasing layer order (kvpark_transfer_wait_layer), so
 * an engine computes layer l while later layers are still arriving. Without
 * it, a transfer completes as a whole (CUDA: one launch for all layers).
 *
 * Lifetimes: the plan (restore) or reservation (park) must stay alive and
 * unreleased/unsealed until its transfer has completed; the bytes it points to
 * are otherwise free to be reused by the daemon. libkvpark asserts this in
 * kvpark_plan_release/kvpark_seal/kvpark_abort (kvpark builds keep asserts on). The page table is copied by the
 * call. The cache's tensors must stay valid while the device is attached.
 *
 * Threads: one kvpark_device may be used from several threads; a transfer
 * belongs to the thread that holds it.
 *
 * Reconnection: after a daemon restart the client maps a new arena. The CUDA
 * path registers each arena mapping the first time a transfer uses it and
 * unregisters it when no plan, reservation or transfer holds it any more
 * (checked on each device call) or when the last device using it detaches.
 */
#ifndef KVPARK_DEVICE_H
#define KVPARK_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpark.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-layer tensor shape; E = elem_bytes, PT = page_tokens, H = kv_heads, D = head_dim:
 *   NHD separate: K, V each [pages][PT][H][D]     NHD fused: KV [pages][2][PT][H][D]
 *   HND separate: K, V each [pages][H][PT][D]     HND fused: KV [pages][2][H][PT][D] */
typedef enum kvpark_kv_layout { KVPARK_KV_NHD = 0, KVPARK_KV_HND = 1 } kvpark_kv_layout;
typedef enum kvpark_kv_fusion { KVPARK_KV_SEPARATE = 0, KVPARK_KV_FUSED = 1 } kvpark_kv_fusion;
typedef enum kvpark_kv_memory {
  KVPARK_MEMORY_HOST = 0, /* k/v point to host memory: CPU path */
  KVPARK_MEMORY_CUDA = 1  /* k/v are CUDA device pointers on cuda_device: CUDA path */
} kvpark_kv_memory;

/* An engine's paged KV cache. Its geometry must match the namespace: one block
 * image, layers * 2 * block_tokens * kv_heads * head_dim * elem_bytes bytes,
 * must equal the namespace's block_payload_bytes. */
typedef struct kvpark_kv_cache {
  uint32_t layers;
  uint32_t pages_total; /* pages in each layer tensor; page ids are [0, pages_total) */
  uint32_t page_tokens; /* token slots per page; need not divide block_tokens */
  uint32_t kv_heads;
  uint32_t head_dim;   /* elements */
  uint32_t elem_bytes; /* 1, 2 or 4; bytes are copied raw */
  kvpark_kv_layout layout;
  kvpark_kv_fusion fusion;
  kvpark_kv_memory memory;
  int cuda_device;    /* CUDA ordinal the tensors live on (memory == CUDA) */
  void* const* k;     /* [layers] K tensor base per layer; fused: the KV tensor */
  void* const* v;     /* [layers] V tensor base per layer; NULL when fused */
} kvpark_kv_cache;

typedef struct kvpark_device kvpark_device;
typedef struct kvpark_transfer kvpark_transfer;

/* kvpark_device_restore flags. */
#define KVPARK_TRANSFER_LAYERWISE 0x1u /* signal each layer's completion in order */

#define KVPARK_WAIT_FOREVER (-1)

/* True when this libkvpark was built with the CUDA path. */
int kvpark_device_cuda_built(void);

/* Attaches a paged KV cache to a client. The k/v pointer arrays are copied.
 * cuda_stream: a cudaStream_t for a CUDA cache (NULL = the legacy default
 * stream); must be NULL for a host cache.
 * KVPARK_INVALID_ARGUMENT: bad geometry (a dimension 0 or over the kernels'
 *   limits, elem_bytes not 1/2/4), a NULL tensor pointer, v given for a fused
 *   cache, a stream for a host cache, or a snapshot-only namespace.
 * KVPARK_GEOMETRY_MISMATCH: an image of block_tokens tokens of this cache is not
 *   the namespace's block_payload_bytes long.
 * KVPARK_UNAVAILABLE: a CUDA cache, but CUDA is not built in or no device is usable.
 * KVPARK_IO_ERROR: the CUDA runtime failed. */
kvpark_status kvpark_device_attach(kvpark_client* client, const kvpark_kv_cache* cache,
                                   void* cuda_stream, kvpark_device** ret_device);

/* Waits for every transfer of the device, unregisters what it registered, frees
 * it. Outstanding kvpark_transfer objects stay valid (completed) until freed.
 * Detach before kvpark_disconnect of its client. NULL is ignored. */
void kvpark_device_detach(kvpark_device* device);

/* Restore: plan blocks -> cache. Moves the sequence's tokens [first_token,
 * first_token + n_tokens), both multiples of block_tokens and within the plan's
 * blocks (block i holds tokens [i*block_tokens, (i+1)*block_tokens)), for the
 * layers [layer_first, layer_first + layer_count) (layer_count 0: through the
 * last layer). page_table[p] is the physical page of logical page p (tokens
 * [p*page_tokens, (p+1)*page_tokens)); n_pages must cover the range. Slots of a
 * page outside the range are left untouched. Queues the copy and returns.
 * KVPARK_INVALID_ARGUMENT (nothing queued) for a bad range, page id or flag. */
kvpark_status kvpark_device_restore(kvpark_device* device, const kvpark_plan* plan,
                                    const int32_t* page_table, size_t n_pages,
                                    uint64_t first_token, uint32_t n_tokens,
                                    uint32_t layer_first, uint32_t layer_count,
                                    uint32_t flags, kvpark_transfer** ret_transfer);

/* Park: cache -> reservation blocks. first_token is the sequence position of
 * the reservation's block 0 (first_block * block_tokens, as reserved) and
 * n_tokens must equal block_count * block_tokens. Blocks whose reservation
 * pointer is NULL (already parked) are skipped. Seal after the transfer
 * completes with KVPARK_OK; abort otherwise. */
kvpark_status kvpark_device_park(kvpark_device* device, const kvpark_reservation* reservation,
                                 const int32_t* page_table, size_t n_pages,
                                 uint64_t first_token, uint32_t n_tokens,
                                 kvpark_transfer** ret_transfer);

/* Waits up to timeout_ms (KVPARK_WAIT_FOREVER: no limit) for the whole
 * transfer. KVPARK_OK when it completed; KVPARK_IN_FLIGHT on timeout; the copy's
 * failure otherwise (KVPARK_IO_ERROR for a CUDA error). */
kvpark_status kvpark_transfer_wait(kvpark_transfer* transfer, int timeout_ms);
/* kvpark_transfer_wait with no waiting. */
kvpark_status kvpark_transfer_poll(kvpark_transfer* transfer);

/* Waits until layer `layer` (and every earlier layer of the transfer) is in
 * the cache. Any transfer accepts it: one without KVPARK_TRANSFER_LAYERWISE
 * signals all its layers at once at completion. KVPARK_INVALID_ARGUMENT for a
 * layer outside the transfer's subrange. */
kvpark_status kvpark_transfer_wait_layer(kvpark_transfer* transfer, uint32_t layer,
                                         int timeout_ms);

/* CUDA: the cudaEvent_t recorded after `layer` (layerwise) or after the whole
 * transfer (any layer of a non-layerwise one), for cudaStreamWaitEvent on another
 * stream; valid until kvpark_transfer_free. NULL on the host path. */
void* kvpark_transfer_event(const kvpark_transfer* transfer, uint32_t layer);

/* Waits for the transfer if it has not completed, then frees it. NULL is ignored. */
void kvpark_transfer_free(kvpark_transfer* transfer);

#ifdef __cplusplus
}
#endif

#endif /* KVPARK_DEVICE_H */
