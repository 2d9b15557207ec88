// Park and restore of llama.cpp sequence state through libkvpark.
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstring>

#include "integrations/llama/kvpark_llama.h"
#include "integrations/llama/snapshot_format.h"

namespace kvpark::llama {
namespace {

constexpr llama_state_seq_flags state_flags = LLAMA_STATE_SEQ_FLAGS_NONE;  // host bytes
constexpr uint32_t promotion_wait_msec_max = 2'000;  // for a disk-tier snapshot to land

Status from_kvpark(kvpark_status s) {
  switch (s) {
    case KVPARK_OK:
    case KVPARK_ALREADY_PRESENT:
    case KVPARK_IN_FLIGHT:
      return Status::ok;
    case KVPARK_ARENA_FULL:
    case KVPARK_LIMIT_EXCEEDED:
      return Status::arena_full;
    case KVPARK_UNAVAILABLE:
      return Status::unavailable;
    case KVPARK_CORRUPT:
      return Status::corrupt;
    case KVPARK_IO_ERROR:
    case KVPARK_OUT_OF_MEMORY:
      return Status::io_error;
    default:
      return Status::invalid_argument;
  }
}

// Whether the model's memory keeps less than every position of a sequence: an iSWA
// cache keeps the window its sliding layers still see, a recurrent or hybrid model one
// state at the last position. Their lowest position says nothing of where the
// sequence starts.
bool memory_keeps_a_suffix(const llama_model* model) {
  return llama_model_n_swa(model) > 0 || llama_model_is_recurrent(model) ||
         llama_model_is_hybrid(model);
}

// Positions in seq_id end at n_tokens - 1 and, where the memory keeps every position,
// start at 0: the sequence is tokens [0, n_tokens).
bool sequence_holds(llama_context* ctx, llama_seq_id seq_id, size_t n_tokens) {
  llama_memory_t mem = llama_get_memory(ctx);
  const llama_pos pos_min = llama_memory_seq_pos_min(mem, seq_id);
  if (n_tokens == 0) return pos_min == -1;
  const bool starts_right =
      pos_min == 0 || (pos_min > 0 && memory_keeps_a_suffix(llama_get_model(ctx)));
  return starts_right && llama_memory_seq_pos_max(mem, seq_id) == llama_pos(n_tokens) - 1;
}

}  // namespace

Status decode_tokens(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                     size_t begin, size_t end) {
  assert(begin <= end);
  const size_t batch_max = llama_n_batch(ctx);
  llama_batch batch = llama_batch_init(int32_t(batch_max), 0, 1);
  Status status = Status::ok;
  for (size_t at = begin; at < end && status == Status::ok;) {
    const size_t n = std::min(end - at, batch_max);
    for (size_t i = 0; i < n; ++i) {
      batch.token[i] = tokens[at + i];
      batch.pos[i] = llama_pos(at + i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = seq_id;
      batch.logits[i] = at + i == end - 1;
    }
    batch.n_tokens = int32_t(n);
    if (llama_decode(ctx, batch) != 0) status = Status::engine_error;
    at += n;
  }
  llama_batch_free(batch);
  return status;
}

kvpark_write_candidate recurrence_candidate(uint32_t capture_hint) {
  return {.position_tokens = capture_hint,
          .evidence = KVPARK_EVIDENCE_OBSERVED_RECURRENCE,
          .entry_class = KVPARK_CLASS_SHARED,
          .reason = KVPARK_CANDIDATE_EXPLICIT};
}

Status Parker::connect(const ConnectOptions& options, std::unique_ptr<Parker>* ret_parker) {
  kvpark_hash128 weights;
  if (Status s = digest_weights(options.model_path, options.cache_dir, &weights); s != Status::ok)
    return s;
  const kvpark_hash128 id = kvpark::llama::namespace_id(weights, options.context_params);
  const kvpark_namespace ns{.id = id,
                            .block_tokens = 0,
                            .block_payload_bytes = 0,
                            .snapshot_required = 1,
                            .prefill_tokens_per_second = options.prefill_tokens_per_second,
                            .client_name = options.client_name};
  kvpark_client* client = nullptr;
  if (kvpark_status s = kvpark_connect(options.socket_path, &ns, &client); s != KVPARK_OK)
    return from_kvpark(s);
  ret_parker->reset(new Parker(client, id));
  return Status::ok;
}

Parker::~Parker() {
  kvpark_disconnect(client_);
}

Status Parker::park(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                    size_t n_tokens, const kvpark_publish_options& options) {
  if (n_tokens == 0 || n_tokens > UINT32_MAX || !sequence_holds(ctx, seq_id, n_tokens))
    return Status::invalid_argument;
  const size_t state_bytes = llama_state_seq_get_size_ext(ctx, seq_id, state_flags);
  if (state_bytes == 0) return Status::engine_error;
  kvpark_reservation* reservation = nullptr;
  const kvpark_status s = kvpark_reserve_snapshot(
      client_, &options, tokens, n_tokens, sizeof(SealedPayloadHeader) + state_bytes, &reservation);
  if (s != KVPARK_OK) return from_kvpark(s);  // ALREADY_PRESENT / IN_FLIGHT: nothing to write
  auto* payload = static_cast<uint8_t*>(kvpark_reservation_snapshot(reservation));
  assert(payload != nullptr);
  const size_t written = llama_state_seq_get_data_ext(ctx, payload + sizeof(SealedPayloadHeader),
                                                      state_bytes, seq_id, state_flags);
  if (written != state_bytes) {
    kvpark_abort(reservation);
    return Status::engine_error;
  }
  sealed_payload_seal(payload, snapshot_magic, uint32_t(n_tokens), state_bytes);
  // Pair assertion (STYLE.md §4): what is sealed passes the check restore() runs.
  assert(sealed_payload_check(payload, sizeof(SealedPayloadHeader) + state_bytes, snapshot_magic,
                              uint32_t(n_tokens)) ==
         SealedPayloadCheck::ok);
  return from_kvpark(kvpark_seal(reservation));
}

Status Parker::restore(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                       size_t n_tokens, uint64_t session_id, RestoreResult* ret_result) {
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_rm(mem, seq_id, -1, -1);
  RestoreResult result;
  kvpark_plan* plan = nullptr;
  if (kvpark_status s = kvpark_lookup(client_, session_id, tokens, n_tokens, &plan); s != KVPARK_OK)
    return from_kvpark(s);
  if (kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan))
    kvpark_plan_wait(plan, promotion_wait_msec_max);  // what is ready stays usable on timeout
  result.capture_hint = kvpark_plan_capture_hint(plan);
  uint32_t position = 0;
  const uint64_t payload_bytes = kvpark_plan_snapshot_bytes(plan, &position);
  if (payload_bytes > 0 && position > 0 && position < n_tokens) {
    // Copied out and verified in one pass, then checked on the private copy: the
    // arena is shared memory, and llama.cpp must get exactly the bytes that passed.
    state_.resize(payload_bytes);
    const kvpark_status copied = kvpark_plan_copy_snapshot(plan, state_.data(), payload_bytes);
    if (copied == KVPARK_CORRUPT) {
      // A miss: libkvpark dropped the altered entry (kvparkd counts it); prefill.
    } else if (copied != KVPARK_OK) {
      kvpark_plan_release(plan);
      return from_kvpark(copied);
    } else if (sealed_payload_check(state_.data(), payload_bytes, snapshot_magic, position) !=
               SealedPayloadCheck::ok) {
      result.refused = Status::corrupt;
    } else {
      const uint8_t* state = state_.data() + sizeof(SealedPayloadHeader);
      const size_t state_bytes = payload_bytes - sizeof(SealedPayloadHeader);
      if (llama_state_seq_set_data_ext(ctx, state, state_bytes, seq_id, state_flags) !=
              state_bytes ||
          !sequence_holds(ctx, seq_id, position)) {
        llama_memory_seq_rm(mem, seq_id, -1, -1);
        result.refused = Status::engine_error;
      } else {
        result.position = position;
        result.reuse_kind = kvpark_plan_reuse_kind(plan);
        kvpark_plan_set_restored_tokens(plan, position);  // counted at release
      }
    }
  }
  kvpark_plan_release(plan);
  *ret_result = result;
  return Status::ok;
}

Status Parker::prefill(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                       size_t n_tokens, uint32_t position, const kvpark_write_candidate* candidates,
                       size_t n_candidates, uint64_t session_id, Status* ret_park_status) {
  Status park_status = Status::ok;
  // In position order: a capture hint may fall before the planner's candidates.
  std::vector<kvpark_write_candidate> sorted(candidates, candidates + n_candidates);
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.position_tokens < b.position_tokens;
  });
  size_t at = position;
  for (const kvpark_write_candidate& candidate : sorted) {
    const size_t stop = candidate.position_tokens;
    if (stop <= at || stop > n_tokens) continue;
    if (Status s = decode_tokens(ctx, seq_id, tokens, at, stop); s != Status::ok) return s;
    at = stop;
    const kvpark_publish_options options{.session_id = session_id,
                                         .entry_class = candidate.entry_class,
                                         .evidence = candidate.evidence};
    const Status s = park(ctx, seq_id, tokens, stop, options);
    if (s != Status::ok && park_status == Status::ok) park_status = s;
  }
  if (Status s = decode_tokens(ctx, seq_id, tokens, at, n_tokens); s != Status::ok) return s;
  if (ret_park_status != nullptr) *ret_park_status = park_status;
  return Status::ok;
}

}  // namespace kvpark::llama
