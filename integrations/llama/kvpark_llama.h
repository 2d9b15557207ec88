// kvpark_llama: parks llama.cpp sequence state in kvparkd and restores it.
//
// Where the model's state is a plain KV cache (every position kept, nothing but K and
// V per token), it is parked as blocks (state_blocks.h): the KV of every 64 tokens is
// one content-addressed block, so a head many sequences share is parked once, and any
// block-aligned prefix of anything parked restores, plus a small tail snapshot at each
// exact position parked. A Parker decides on its first image, by a self-check (the
// image cut and written again comes out byte for byte, and llama.cpp restores a prefix
// written from its blocks and gives that prefix back byte for byte); then it connects
// again in the block namespace. Anything else (an iSWA window, a hybrid's or recurrent
// model's state, a layout the reader does not know, a failed self-check, or
// ConnectOptions::park_blocks off) is parked whole: a snapshot of the state at its
// exact position (DESIGN.md §2: block_tokens 0, snapshot_required 1), restored exactly
// where it was parked and nowhere else. parking_mode() says which, and why.
//
// Every payload carries an XXH3 checksum, verified as it is copied out of the arena
// onto a private buffer before llama.cpp sees a byte; a payload that fails it is a
// miss (prefill from 0).
//
// The namespace fingerprint covers the weights (XXH3-128 of the model file, cached
// by device, inode, size and mtime), llama.cpp's state format and every context
// parameter that changes what the state bytes mean (see namespace_id()); the block
// namespace adds the image layout and block size.
//
// Threads: a Parker is used by one thread at a time.
#pragma once

#include <llama.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "client/kvpark_planner.h"
#include "integrations/llama/state_blocks.h"
#include "integrations/llama/weights_digest.h"  // default_cache_dir()

namespace kvpark::llama {

enum class Status {
  ok,
  not_found,         // no such model file
  unavailable,       // no daemon, or the connection was lost
  arena_full,        // the daemon could not hold the snapshot
  corrupt,           // a parked snapshot failed its checks: refused, prefill instead
  engine_error,      // llama.cpp refused a state or a decode
  invalid_argument,  // e.g. park() at a position the sequence is not at
  io_error,
};
const char* status_string(Status status);

// XXH3-128 of the model file. With a cache_dir, the digest is kept there keyed by
// (device, inode, size, mtime), so an unchanged file is read only once.
Status digest_weights(const std::string& model_path, const std::string& cache_dir,
                      kvpark_hash128* ret_digest);

// Whether LLAMA_ATTN_ROT_DISABLE turns off the Hadamard rotation llama.cpp applies to
// quantized K/V rows (read as llama.cpp reads it).
bool attention_rotation_disabled();

// The namespace: weights digest (which covers everything the model file fixes: the
// family, SWA window and pattern, recurrent state sizes, experts), llama.cpp's
// sequence-state format, KV cache types, flash attention (V layout), the rotation of
// quantized caches, sequences and their streams, recurrent snapshots, SWA sizing and
// RoPE/YaRN parameters (K is stored after RoPE). Not included, since they change
// neither the layout nor the meaning of the bytes: n_ctx (a state that does not fit is
// refused by llama.cpp), n_batch, n_ubatch, threads, offload.
kvpark_hash128 namespace_id(kvpark_hash128 weights_digest, const llama_context_params& params,
                            bool rotation_disabled = attention_rotation_disabled());

struct ConnectOptions {
  const char* socket_path = nullptr;  // NULL: $KVPARK_SOCKET or the default
  std::string model_path;
  std::string cache_dir;  // digest cache; empty: no cache
  llama_context_params context_params{};
  uint32_t prefill_tokens_per_second = 0;  // 0: unknown
  const char* client_name = "kvpark-llama";
  bool park_blocks = true;  // false: whole snapshots even where the state splits
};

struct RestoreResult {
  uint32_t position = 0;  // tokens restored; 0: prefill everything
  kvpark_reuse_kind reuse_kind = KVPARK_REUSE_ROOT;
  Status refused = Status::ok;  // why a snapshot was found but not applied
  // A position other sessions' prompts share with this one past what is parked
  // (recurrence detection; 0: none): a snapshot there serves them, which for a
  // recurrent or iSWA model is the only place one can. Pass it to prefill() as a
  // candidate (recurrence_candidate()).
  uint32_t capture_hint = 0;
};

// The write candidate for a capture hint: shared, evidence observed recurrence.
kvpark_write_candidate recurrence_candidate(uint32_t capture_hint);

class Parker {
 public:
  static Status connect(const ConnectOptions& options, std::unique_ptr<Parker>* ret_parker);
  ~Parker();
  Parker(const Parker&) = delete;
  Parker& operator=(const Parker&) = delete;

  // Parks the state of seq_id, which must hold exactly tokens [0, n_tokens).
  // Already parked (or being parked by another engine) is ok.
  Status park(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens, size_t n_tokens,
              const kvpark_publish_options& options);

  // Clears seq_id and restores the longest parked prefix of tokens[0, n_tokens)
  // into it (always short of n_tokens). Status is ok whenever the caller can go on
  // prefilling from ret_result->position, a refused snapshot included.
  Status restore(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                 size_t n_tokens, uint64_t session_id, RestoreResult* ret_result);

  // Decodes tokens [position, n_tokens) into seq_id, parking at each candidate
  // position in (position, n_tokens] on the way (write-candidate planner output and
  // capture hints, in any order);
  // logits are computed for the last token only. Parking failures do not stop
  // the prefill; the first one is returned in *ret_park_status when given.
  Status prefill(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                 size_t n_tokens, uint32_t position, const kvpark_write_candidate* candidates,
                 size_t n_candidates, uint64_t session_id, Status* ret_park_status = nullptr);

  // The namespace parked in now: the block namespace once blocks are decided.
  kvpark_hash128 namespace_id() const { return namespace_id_; }
  // The connection in that namespace: another one once blocks are decided.
  kvpark_client* client() { return client_; }
  // "blocks", "whole: <why>", or "undecided" before the first image.
  std::string parking_mode() const;

 private:
  Parker(const ConnectOptions& options, kvpark_client* client, kvpark_hash128 id);
  // Decides how this context's state parks, once, on an image of seq_id (which holds
  // it): the self-check, then the block namespace's connection. keep_sequence puts
  // the image back into seq_id after the check, else seq_id is left empty.
  Status decide(llama_context* ctx, llama_seq_id seq_id, std::span<const uint8_t> image,
                bool keep_sequence);
  // restore() before anything is decided: an image of the prompt's first tokens.
  Status decide_on_prompt(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                          size_t n_tokens);
  Status park_whole(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                    size_t n_tokens, const kvpark_publish_options& options);
  // Reserves the blocks and tail, then cuts them from seq_id's image (in state_ already
  // when image_read).
  Status park_blocks(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                     size_t n_tokens, const kvpark_publish_options& options, bool image_read);
  Status read_image(llama_context* ctx, llama_seq_id seq_id);  // seq_id's image into state_
  // A model whose memory is not per token parks whole: settled before any image.
  void settle_by_memory(llama_context* ctx);
  // Restore plan's longest prefix short of n_tokens into seq_id (empty); a refusal
  // is in *result, an error from kvparkd returned.
  Status restore_whole(llama_context* ctx, llama_seq_id seq_id, kvpark_plan* plan,
                     size_t n_tokens, RestoreResult* result);
  Status restore_blocks(llama_context* ctx, llama_seq_id seq_id, kvpark_plan* plan,
                        size_t n_tokens, RestoreResult* result);

  enum class Mode { undecided, blocks, whole };

  const std::string socket_path_;  // empty: $KVPARK_SOCKET or the default
  const std::string client_name_;
  const uint32_t prefill_tokens_per_second_;
  const kvpark_hash128 base_id_;  // the whole-snapshot namespace
  kvpark_client* client_;
  kvpark_hash128 namespace_id_;
  Mode mode_;
  std::string whole_why_;
  std::shared_ptr<const BlockShape> shape_;  // blocks: the layout and namespace
  std::vector<uint8_t> state_;  // a private copy of an image, parked or restored
  std::vector<uint8_t> tail_;   // restore's private copy of a tail snapshot
};

// Decodes tokens [begin, end) of seq_id in llama_n_batch() chunks; logits for the
// last token only. Positions are the token indices.
Status decode_tokens(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                     size_t begin, size_t end);

}  // namespace kvpark::llama
