// kvpark-llama-engine: one llama.cpp engine process for tests/llama. Builds a
// prompt of seeded random token ids (a head, then a tail of another seed),
// restores what kvparkd has parked, prefills the rest (parking at --park-at
// positions), and reports on stdout:
//   restored P KIND REFUSED   the restore (REFUSED: ok, corrupt, engine error)
//   state P HEX               XXH3-64 of the sequence state at P tokens: after a
//                             restore of P > 0, or after the first --split P decode
//   hint H                    kvparkd's capture hint (a recurring prefix): parked there
//   parked                    after every park
//   logits HEX                XXH3-64 of the last token's logits (all of them)
//   ready                     with --hold: then waits to be killed
//   ttft_ms T                 restore + prefill, until the last logits
// --plan parks where the write-candidate planner says for a prompt of a system
// message (the head) and a user message (the tail): the system frontier and the
// last content. "parking MODE" says how the parker parks (blocks, or whole: why);
// --park-whole asks for whole snapshots. --no-kvpark prefills everything without a daemon; --private parks as the
// session's own (private) state instead of shared; --split N (with --no-kvpark)
// decodes [0, N), reloads its own state there and decodes the rest: an engine
// continuing from its own cached prefix. --type-k/--type-v f16|q8_0 and --flash-attn pick the KV
// cache. Exit 0, or 1 on failure.
#include <ggml-backend.h>
#include <llama.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "integrations/llama/kvpark_llama.h"

namespace {

struct Args {
  std::string model, socket, cache_dir, type_k = "f16", type_v = "f16", backends;
  uint64_t head_seed = 1, tail_seed = 2, session = 1;
  size_t head = 1000, total = 1100, split = 0;
  std::vector<uint32_t> park_at;
  uint32_t n_ctx = 4096;
  bool kvpark = true, hold = false, private_class = false, plan = false, flash_attn = false,
       park_whole = false;
};

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}
bool no_progress(float, void*) {
  return true;
}

std::vector<llama_token> prompt(const Args& a, uint32_t vocab) {
  std::vector<llama_token> t;
  uint64_t s = a.head_seed;
  for (size_t i = 0; i < a.total; ++i) {
    if (i == a.head) s = a.tail_seed * 0x9e3779b97f4a7c15ull;
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t.push_back(llama_token(3 + (s >> 33) % (vocab - 3)));  // past <unk> <s> </s>
  }
  return t;
}

ggml_type kv_type(const std::string& name) {
  return name == "q8_0" ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
}

std::vector<uint8_t> sequence_state(llama_context* ctx) {
  std::vector<uint8_t> state(llama_state_seq_get_size_ext(ctx, 0, 0));
  state.resize(llama_state_seq_get_data_ext(ctx, state.data(), state.size(), 0, 0));
  return state;
}

void print_state(const std::vector<uint8_t>& state, size_t position) {
  std::printf("state %zu %016llx\n", position,
              (unsigned long long)XXH3_64bits(state.data(), state.size()));
}

int fail(const char* what, kvpark::llama::Status s) {
  std::fprintf(stderr, "kvpark-llama-engine: %s: %s\n", what, kvpark::llama::status_string(s));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.backends = std::getenv("KVPARK_LLAMA_BACKENDS") ? std::getenv("KVPARK_LLAMA_BACKENDS") : "";
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--no-kvpark")
      a.kvpark = false;
    else if (k == "--hold")
      a.hold = true;
    else if (k == "--private")
      a.private_class = true;
    else if (k == "--plan")
      a.plan = true;
    else if (k == "--flash-attn")
      a.flash_attn = true;
    else if (k == "--park-whole")
      a.park_whole = true;
    else if (k == "--type-v")
      a.type_v = v, ++i;
    else if (k == "--split")
      a.split = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--ctx")
      a.n_ctx = uint32_t(std::strtoul(v, nullptr, 10)), ++i;
    else if (k == "--model")
      a.model = v, ++i;
    else if (k == "--socket")
      a.socket = v, ++i;
    else if (k == "--cache-dir")
      a.cache_dir = v, ++i;
    else if (k == "--type-k")
      a.type_k = v, ++i;
    else if (k == "--head-seed")
      a.head_seed = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--tail-seed")
      a.tail_seed = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--session")
      a.session = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--head")
      a.head = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--total")
      a.total = std::strtoull(v, nullptr, 10), ++i;
    else if (k == "--park-at")
      a.park_at.push_back(uint32_t(std::strtoul(v, nullptr, 10))), ++i;
    else {
      std::fprintf(stderr, "kvpark-llama-engine: unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  llama_log_set(quiet_log, nullptr);
  if (!a.backends.empty()) ggml_backend_load_all_from_path(a.backends.c_str());
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.progress_callback = no_progress;
  llama_model* model = llama_model_load_from_file(a.model.c_str(), mp);
  if (model == nullptr) return fail("load model", kvpark::llama::Status::engine_error);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = a.n_ctx;
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.flash_attn_type =
      a.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = kv_type(a.type_k);
  cp.type_v = kv_type(a.type_v);
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return fail("create context", kvpark::llama::Status::engine_error);
  const auto tokens = prompt(a, uint32_t(llama_vocab_n_tokens(llama_model_get_vocab(model))));

  const auto started = std::chrono::steady_clock::now();
  std::unique_ptr<kvpark::llama::Parker> parker;
  uint32_t position = 0;
  if (a.kvpark) {
    kvpark::llama::ConnectOptions co{.socket_path = a.socket.empty() ? nullptr : a.socket.c_str(),
                                     .model_path = a.model,
                                     .cache_dir = a.cache_dir,
                                     .context_params = cp,
                                     .park_blocks = !a.park_whole};
    if (auto s = kvpark::llama::Parker::connect(co, &parker); s != kvpark::llama::Status::ok)
      return fail("connect", s);
    kvpark::llama::RestoreResult r;
    if (auto s = parker->restore(ctx, 0, tokens.data(), tokens.size(), a.session, &r);
        s != kvpark::llama::Status::ok)
      return fail("restore", s);
    position = r.position;
    std::printf("restored %u %d %s\n", r.position, int(r.reuse_kind),
                kvpark::llama::status_string(r.refused));
    if (position > 0) print_state(sequence_state(ctx), position);
    std::vector<kvpark_write_candidate> candidates;
    if (a.plan) {
      const kvpark_segment segments[] = {
          {.kind = KVPARK_SEGMENT_SYSTEM, .end_token = uint32_t(a.head), .explicit_breakpoint = 0},
          {.kind = KVPARK_SEGMENT_USER, .end_token = uint32_t(a.total), .explicit_breakpoint = 0}};
      const kvpark_write_plan_options options{.total_tokens = uint32_t(a.total)};
      candidates.resize(KVPARK_WRITE_CANDIDATES_MAX);
      size_t count = 0;
      if (kvpark_plan_write_candidates(segments, 2, &options, candidates.data(), &count) !=
          KVPARK_OK)
        return fail("plan writes", kvpark::llama::Status::invalid_argument);
      candidates.resize(count);
    }
    if (r.capture_hint > 0) {
      std::printf("hint %u\n", r.capture_hint);
      candidates.push_back(kvpark::llama::recurrence_candidate(r.capture_hint));
    }
    for (uint32_t p : a.park_at)
      candidates.push_back(
          {.position_tokens = p,
           .evidence = KVPARK_EVIDENCE_DEFAULT_AUTOMATIC,
           .entry_class = a.private_class ? KVPARK_CLASS_PRIVATE : KVPARK_CLASS_SHARED,
           .reason = KVPARK_CANDIDATE_SYSTEM_FRONTIER});
    kvpark::llama::Status park_status;
    if (auto s = parker->prefill(ctx, 0, tokens.data(), tokens.size(), position, candidates.data(),
                                 candidates.size(), a.session, &park_status);
        s != kvpark::llama::Status::ok)
      return fail("prefill", s);
    if (park_status != kvpark::llama::Status::ok) return fail("park", park_status);
    if (!candidates.empty()) std::printf("parked\n");
    std::printf("parking %s\n", parker->parking_mode().c_str());
  } else {
    const size_t split = a.split > 0 && a.split < tokens.size() ? a.split : 0;
    if (split > 0) {
      if (auto s = kvpark::llama::decode_tokens(ctx, 0, tokens.data(), 0, split);
          s != kvpark::llama::Status::ok)
        return fail("prefill", s);
      // llama.cpp's own round trip, as its prompt cache restores a prefix: what a
      // restore from kvparkd must equal, on every memory (an iSWA cache keeps the
      // window only, in other cells than a cache that never reloaded).
      const std::vector<uint8_t> state = sequence_state(ctx);
      print_state(state, split);
      llama_memory_seq_rm(llama_get_memory(ctx), 0, -1, -1);
      if (llama_state_seq_set_data_ext(ctx, state.data(), state.size(), 0, 0) != state.size())
        return fail("reload state", kvpark::llama::Status::engine_error);
    }
    if (auto s = kvpark::llama::decode_tokens(ctx, 0, tokens.data(), split, tokens.size());
        s != kvpark::llama::Status::ok)
      return fail("prefill", s);
  }
  const float* logits = llama_get_logits_ith(ctx, -1);
  const auto elapsed = std::chrono::steady_clock::now() - started;
  std::printf("ttft_ms %.1f\n", std::chrono::duration<double, std::milli>(elapsed).count());
  const size_t n_vocab = size_t(llama_vocab_n_tokens(llama_model_get_vocab(model)));
  std::printf("logits %016llx\n", (unsigned long long)XXH3_64bits(logits, n_vocab * sizeof(float)));
  std::fflush(stdout);
  if (a.hold) {
    std::printf("ready\n");
    std::fflush(stdout);
    for (;;) pause();
  }
  parker.reset();
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}
