// Park and restore of llama.cpp sequence state through libkvpark.
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <span>

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

// Hands a checked image of [0, position) to llama.cpp: seq_id holds it after, or is
// left empty with the refusal in *result.
void load_image(llama_context* ctx, llama_seq_id seq_id, const uint8_t* image, size_t bytes,
                uint32_t position, RestoreResult* result) {
  if (llama_state_seq_set_data_ext(ctx, image, bytes, seq_id, state_flags) != bytes ||
      !sequence_holds(ctx, seq_id, position)) {
    llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
    result->refused = Status::engine_error;
    return;
  }
  result->position = position;
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
  ret_parker->reset(new Parker(options, client, id));
  return Status::ok;
}

Parker::Parker(const ConnectOptions& options, kvpark_client* client, kvpark_hash128 id)
    : socket_path_(options.socket_path != nullptr ? options.socket_path : ""),
      client_name_(options.client_name != nullptr ? options.client_name : "kvpark-llama"),
      prefill_tokens_per_second_(options.prefill_tokens_per_second),
      base_id_(id),
      client_(client),
      namespace_id_(id),
      mode_(options.park_blocks ? Mode::undecided : Mode::whole),
      whole_why_(options.park_blocks ? "" : "asked to park whole") {}

Parker::~Parker() {
  kvpark_disconnect(client_);
}

std::string Parker::parking_mode() const {
  switch (mode_) {
    case Mode::undecided:
      return "undecided";
    case Mode::blocks:
      return "blocks";
    case Mode::whole:
      break;
  }
  return "whole: " + whole_why_;
}

Status Parker::decide(llama_context* ctx, llama_seq_id seq_id, std::span<const uint8_t> image,
                      bool keep_sequence) {
  assert(mode_ == Mode::undecided);
  StateImage parsed;
  std::string why;
  if (!check_split(image, ImageKind::sequence, &parsed, &why)) {
    mode_ = Mode::whole;
    whole_why_ = "state not split: " + why;
    return Status::ok;
  }
  if (parsed.cells < 2) return Status::ok;  // a longer image decides
  // llama.cpp must take a prefix written from blocks, and give it back as written.
  const std::vector<uint8_t> prefix = recompose(parsed, image, 1, state_block_tokens);
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_rm(mem, seq_id, -1, -1);
  bool accepted =
      llama_state_seq_set_data_ext(ctx, prefix.data(), prefix.size(), seq_id, state_flags) ==
          prefix.size() &&
      sequence_holds(ctx, seq_id, 1) &&
      llama_state_seq_get_size_ext(ctx, seq_id, state_flags) == prefix.size();
  if (accepted) {
    std::vector<uint8_t> back(prefix.size());
    accepted = llama_state_seq_get_data_ext(ctx, back.data(), back.size(), seq_id, state_flags) ==
                   back.size() &&
               back == prefix;
  }
  llama_memory_seq_rm(mem, seq_id, -1, -1);
  if (keep_sequence &&
      (llama_state_seq_set_data_ext(ctx, image.data(), image.size(), seq_id, state_flags) !=
           image.size() ||
       !sequence_holds(ctx, seq_id, parsed.cells)))
    return Status::engine_error;
  if (!accepted) {
    mode_ = Mode::whole;
    whole_why_ = "llama.cpp did not give back a prefix written from blocks as written";
    return Status::ok;
  }
  std::shared_ptr<const BlockShape> shape = make_block_shape(parsed.layout, base_id_);
  const kvpark_namespace ns{.id = shape->space,
                            .block_tokens = shape->block_tokens,
                            .block_payload_bytes = shape->block_bytes,
                            .snapshot_required = 0,  // blocks restore on their own
                            .prefill_tokens_per_second = prefill_tokens_per_second_,
                            .client_name = client_name_.c_str()};
  kvpark_client* client = nullptr;
  if (kvpark_status s = kvpark_connect(socket_path_.empty() ? nullptr : socket_path_.c_str(),
                                       &ns, &client);
      s != KVPARK_OK)
    return from_kvpark(s);  // still undecided: the next image tries again
  kvpark_disconnect(client_);
  client_ = client;
  namespace_id_ = shape->space;
  shape_ = std::move(shape);
  mode_ = Mode::blocks;
  return Status::ok;
}

Status Parker::decide_on_prompt(llama_context* ctx, llama_seq_id seq_id,
                                const llama_token* tokens, size_t n_tokens) {
  if (n_tokens < 3) return Status::ok;  // a restore needs a token left to decode
  if (Status s = decode_tokens(ctx, seq_id, tokens, 0, 2); s != Status::ok) return s;
  if (Status s = read_image(ctx, seq_id); s != Status::ok) {
    llama_memory_seq_rm(llama_get_memory(ctx), seq_id, -1, -1);
    return s;
  }
  return decide(ctx, seq_id, state_, /*keep_sequence=*/false);
}

Status Parker::read_image(llama_context* ctx, llama_seq_id seq_id) {
  const size_t bytes = llama_state_seq_get_size_ext(ctx, seq_id, state_flags);
  if (bytes == 0) return Status::engine_error;
  state_.resize(bytes);
  return llama_state_seq_get_data_ext(ctx, state_.data(), bytes, seq_id, state_flags) == bytes
             ? Status::ok
             : Status::engine_error;
}

void Parker::settle_by_memory(llama_context* ctx) {
  if (mode_ != Mode::undecided || !memory_keeps_a_suffix(llama_get_model(ctx))) return;
  mode_ = Mode::whole;
  whole_why_ = "the model's memory is not per token (iSWA window or recurrent state)";
}

Status Parker::park(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                    size_t n_tokens, const kvpark_publish_options& options) {
  if (n_tokens == 0 || n_tokens > UINT32_MAX || !sequence_holds(ctx, seq_id, n_tokens))
    return Status::invalid_argument;
  settle_by_memory(ctx);
  bool image_read = false;
  if (mode_ == Mode::undecided) {
    if (Status s = read_image(ctx, seq_id); s != Status::ok) return s;
    if (Status s = decide(ctx, seq_id, state_, /*keep_sequence=*/true); s != Status::ok)
      return s;
    image_read = true;
  }
  if (mode_ != Mode::blocks) return park_whole(ctx, seq_id, tokens, n_tokens, options);
  return park_blocks(ctx, seq_id, tokens, n_tokens, options, image_read);
}

Status Parker::park_whole(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                          size_t n_tokens, const kvpark_publish_options& options) {
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

Status Parker::park_blocks(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                           size_t n_tokens, const kvpark_publish_options& options,
                           bool image_read) {
  // Reserved first: a head other sequences parked is not copied out of llama.cpp again.
  BlockReservation reservation;
  const kvpark_status s =
      reservation.reserve(client_, shape_, options, tokens, uint32_t(n_tokens));
  if (s != KVPARK_OK) return from_kvpark(s);  // ALREADY_PRESENT / IN_FLIGHT: nothing to write
  if (!image_read) {
    if (Status read = read_image(ctx, seq_id); read != Status::ok) return read;
  }
  StateImage parsed;
  std::string why;
  // The layout checked at decision time, holding the tokens: anything else is a
  // llama.cpp this build does not know, and is not parked.
  if (!parse_state_image(state_, ImageKind::sequence, &parsed, &why) ||
      !(placement_neutral(parsed.layout) == placement_neutral(shape_->layout)) ||
      parsed.cells != n_tokens)
    return Status::engine_error;
  return from_kvpark(reservation.fill_and_seal(parsed, state_.data()));
}

Status Parker::restore(llama_context* ctx, llama_seq_id seq_id, const llama_token* tokens,
                       size_t n_tokens, uint64_t session_id, RestoreResult* ret_result) {
  llama_memory_t mem = llama_get_memory(ctx);
  llama_memory_seq_rm(mem, seq_id, -1, -1);
  settle_by_memory(ctx);
  if (mode_ == Mode::undecided) {
    if (Status s = decide_on_prompt(ctx, seq_id, tokens, n_tokens);
        s != Status::ok && s != Status::unavailable)
      return s;
    llama_memory_seq_rm(mem, seq_id, -1, -1);
  }
  RestoreResult result;
  kvpark_plan* plan = nullptr;
  if (kvpark_status s = kvpark_lookup(client_, session_id, tokens, n_tokens, &plan); s != KVPARK_OK)
    return from_kvpark(s);
  if (kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan))
    kvpark_plan_wait(plan, promotion_wait_msec_max);  // what is ready stays usable on timeout
  result.capture_hint = kvpark_plan_capture_hint(plan);
  const Status status = mode_ == Mode::blocks
                            ? restore_blocks(ctx, seq_id, plan, n_tokens, &result)
                            : restore_whole(ctx, seq_id, plan, n_tokens, &result);
  if (result.position > 0) {
    result.reuse_kind = kvpark_plan_reuse_kind(plan);
    kvpark_plan_set_restored_tokens(plan, result.position);  // counted at release
  }
  kvpark_plan_release(plan);
  if (status == Status::ok) *ret_result = result;
  return status;
}

Status Parker::restore_whole(llama_context* ctx, llama_seq_id seq_id, kvpark_plan* plan,
                             size_t n_tokens, RestoreResult* result) {
  uint32_t position = 0;
  const uint64_t payload_bytes = kvpark_plan_snapshot_bytes(plan, &position);
  if (payload_bytes == 0 || position == 0 || position >= n_tokens) return Status::ok;
  // Copied out and verified in one pass, then checked on the private copy: the
  // arena is shared memory, and llama.cpp must get exactly the bytes that passed.
  state_.resize(payload_bytes);
  const kvpark_status copied = kvpark_plan_copy_snapshot(plan, state_.data(), payload_bytes);
  if (copied == KVPARK_CORRUPT) return Status::ok;  // a miss: libkvpark dropped it
  if (copied != KVPARK_OK) return from_kvpark(copied);
  if (sealed_payload_check(state_.data(), payload_bytes, snapshot_magic, position) !=
      SealedPayloadCheck::ok) {
    result->refused = Status::corrupt;
    return Status::ok;
  }
  load_image(ctx, seq_id, state_.data() + sizeof(SealedPayloadHeader),
             payload_bytes - sizeof(SealedPayloadHeader), position, result);
  return Status::ok;
}

Status Parker::restore_blocks(llama_context* ctx, llama_seq_id seq_id, kvpark_plan* plan,
                              size_t n_tokens, RestoreResult* result) {
  if (n_tokens == 0) return Status::ok;
  uint32_t position =
      plan_block_position(plan, *shape_, uint32_t(std::min<size_t>(n_tokens - 1, UINT32_MAX)));
  if (position == 0) return Status::ok;
  // The image as llama.cpp writes it for seq_id: its stream, its sequence id.
  BlockShape placed = *shape_;
  placed.layout.source_seq_id = seq_id;
  placed.layout.cell_seq_id = seq_id;
  placed.layout.stream_index = placed.layout.stream_count > 1 ? uint32_t(seq_id) : 0;
  const uint32_t tail = position % placed.block_tokens;
  const uint8_t* tail_body = nullptr;
  if (tail > 0) {
    // Small: copied out whole and verified first, as a whole snapshot is. One that
    // fails leaves the blocks before it to restore.
    uint32_t at = 0;
    const uint64_t payload_bytes = kvpark_plan_snapshot_bytes(plan, &at);
    tail_.resize(payload_bytes);
    const kvpark_status copied = kvpark_plan_copy_snapshot(plan, tail_.data(), payload_bytes);
    if (copied != KVPARK_OK && copied != KVPARK_CORRUPT) return from_kvpark(copied);
    // KVPARK_CORRUPT: libkvpark dropped it (kvparkd counts it), a miss.
    const bool intact = copied == KVPARK_OK && payload_bytes == placed.tail_payload_bytes(tail) &&
                        sealed_payload_check(tail_.data(), payload_bytes, state_tail_magic,
                                             position) == SealedPayloadCheck::ok;
    if (copied == KVPARK_OK && !intact) result->refused = Status::corrupt;
    if (intact)
      tail_body = tail_.data() + sizeof(SealedPayloadHeader);
    else
      position -= tail;
    if (position == 0) return Status::ok;
  }
  // Every block verified as it is copied into the private image: llama.cpp gets
  // exactly the bytes that passed.
  state_.resize(state_image_bytes(placed.layout, position));
  MemoryOutput out(state_);
  std::string refused;
  bool corrupt = false;
  if (!write_image_from_plan(plan, placed, {}, position, tail_body, out, &refused, &corrupt)) {
    if (!corrupt) result->refused = Status::io_error;  // corrupt: a miss, dropped
    return Status::ok;
  }
  assert(out.complete());
  load_image(ctx, seq_id, state_.data(), state_.size(), position, result);
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
