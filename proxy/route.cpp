#include "proxy/route.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <limits>

#include "integrations/llama/weights_digest.h"
#include "proto/names.h"

namespace kvpark::proxy {
namespace {

constexpr auto refresh_interval = std::chrono::seconds(5);
constexpr auto retry_interval = std::chrono::seconds(1);  // while an upstream is not ready
// llama-server closes an idle connection after 5 s: the witness is handed over well
// before.
constexpr auto witness_renew_interval = std::chrono::seconds(2);
constexpr uint32_t namespace_format_version = 1;     // bump when the fields below change
// llama-server refusing this many parked states in a row, with no restore between,
// means the namespace is wrong for it (a state-shaping flag the proxy was not told);
// one refusal may be passing (a full KV cache gives the same error).
constexpr uint32_t refusals_before_new_epoch = 2;
// A prefill this short is mostly llama-server's fixed cost per request, not its rate.
constexpr uint32_t prefill_rate_sample_tokens_min = 256;
// A measured rate within this factor of the declared one is not declared again: each
// declaration is a new connection, and concurrent requests make single figures swing.
constexpr double prefill_rate_change_factor = 2.0;

// XXH3-128 over the fields that decide whether a slot file restores: the weights,
// the llama.cpp build (its state format) and the operator's state-relevant flags.
kvpark_hash128 make_namespace(kvpark_hash128 weights, const std::string& build_info,
                              const std::string& settings, llama::MemoryShape memory,
                              uint32_t epoch) {
  std::string fields = "kvparkpx";
  auto add = [&](const void* p, size_t n) { fields.append(static_cast<const char*>(p), n); };
  add(&namespace_format_version, sizeof namespace_format_version);
  add(&weights.low, sizeof weights.low);
  add(&weights.high, sizeof weights.high);
  const uint64_t build_bytes = build_info.size();
  add(&build_bytes, sizeof build_bytes);
  fields += build_info;
  fields += settings;
  // States of a memory that cannot be trimmed were parked under other rules (no turn
  // closures holding generated tokens): never mixed with what an older proxy parked.
  // A KV cache's namespace stays as it was.
  if (memory != llama::MemoryShape::kv_cache)
    fields += std::string(" memory=") + llama::memory_shape_string(memory);
  add(&epoch, sizeof epoch);
  const XXH128_hash_t h = XXH3_128bits(fields.data(), fields.size());
  return kvpark_hash128{.low = h.low64, .high = h.high64};
}

}  // namespace

const char* reuse_kind_string(ReuseKind kind) {
  switch (kind) {
    case ReuseKind::root: return reuse_kind_name(kvpark::ReuseKind::Root);
    case ReuseKind::shared_stable_prefix: return reuse_kind_name(kvpark::ReuseKind::SharedStablePrefix);
    case ReuseKind::private_turn_closure: return reuse_kind_name(kvpark::ReuseKind::PrivateTurnClosure);
    case ReuseKind::slot: return "slot";
    case ReuseKind::uncached: return "uncached";
    case ReuseKind::count: break;
  }
  return "?";
}

const char* restore_failure_string(RestoreFailure cause) {
  switch (cause) {
    case RestoreFailure::checksum: return "checksum";
    case RestoreFailure::refused: return "refused";
    case RestoreFailure::slot_file: return "slot_file";
    case RestoreFailure::misconfigured: return "misconfigured";
    case RestoreFailure::discarded:
      return "discarded";
    case RestoreFailure::count: break;
  }
  return "?";
}

const char* upstream_state_string(UpstreamState state) {
  switch (state) {
    case UpstreamState::verifying: return "verifying";
    case UpstreamState::ready: return "ready";
    case UpstreamState::unreachable: return "unreachable";
    case UpstreamState::misconfigured: return "misconfigured";
  }
  return "?";
}

void SlotFileSizes::observe(uint32_t tokens, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  if (known_ == 2 && predict_locked(tokens) != bytes) known_ = 0;  // the fit failed: start over
  if (known_ > 0 && tokens == tokens_[known_ - 1]) {
    if (bytes != bytes_[known_ - 1]) known_ = 0;  // same length, another size: not linear
    if (known_ > 0) return;
  }
  if (known_ == 2) {  // keep the latest two
    tokens_[0] = tokens_[1];
    bytes_[0] = bytes_[1];
    known_ = 1;
  }
  tokens_[known_] = tokens;
  bytes_[known_] = bytes;
  ++known_;
}

uint64_t SlotFileSizes::predict(uint32_t tokens) const {
  std::lock_guard lock(mutex_);
  return predict_locked(tokens);
}

uint64_t SlotFileSizes::predict_locked(uint32_t tokens) const {
  if (known_ < 2) return 0;
  const int64_t dt = int64_t(tokens_[1]) - int64_t(tokens_[0]);
  const int64_t db = int64_t(bytes_[1]) - int64_t(bytes_[0]);
  if (dt == 0 || db % dt != 0) return 0;  // not a whole number of bytes a token
  const int64_t predicted = int64_t(bytes_[1]) + db / dt * (int64_t(tokens) - int64_t(tokens_[1]));
  return predicted > 0 ? uint64_t(predicted) : 0;
}

bool HeadFlights::lead_or_wait(uint64_t key, uint32_t timeout_msec) {
  std::unique_lock lock(mutex_);
  auto it = leading_.find(key);
  if (it == leading_.end()) {
    leading_.emplace(key, ++generation_);
    return true;
  }
  const uint64_t generation = it->second;
  done_.wait_for(lock, std::chrono::milliseconds(timeout_msec), [&] {
    auto now = leading_.find(key);
    return now == leading_.end() || now->second != generation;
  });
  return false;
}

void HeadFlights::finish(uint64_t key) {
  std::lock_guard lock(mutex_);
  leading_.erase(key);
  done_.notify_all();
}

Route::Route(const UpstreamOptions& upstream, const ProxyOptions& options, size_t index,
             std::function<void()> on_state_change)
    : upstream_(upstream),
      parking_(options.socket_path, "kvpark-proxy/" + upstream.name),
      slot_dir_(options.slot_dir),
      park_blocks_(options.park_blocks),
      index_(index),
      digest_cache_(options.digest_cache.empty() ? llama::default_cache_dir()
                                                 : options.digest_cache),
      on_state_change_(std::move(on_state_change)),
      watch_(upstream.url) {
  watcher_ = std::thread([this] { watch(); });
}

Route::~Route() {
  {
    std::lock_guard lock(watch_mutex_);
    stopping_ = true;
  }
  watch_wake_.notify_all();
  watcher_.join();
}

void Route::watch() {
  // The constructor's caller refreshed once already (main, before "ready").
  std::unique_lock lock(watch_mutex_);
  auto next_refresh = std::chrono::steady_clock::now();
  while (!stopping_) {
    const auto interval = ready_ ? refresh_interval : retry_interval;
    watch_wake_.wait_for(lock, ready_ ? witness_renew_interval : retry_interval,
                         [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    if (now - next_refresh >= interval) {
      next_refresh = now;
      refresh(true);
    }
    // Keeps the witness alive; a closed one means the process may have changed.
    if (ready_ && !watch_.renew()) check_process();
    lock.lock();
  }
}

void Route::check_process() {
  if (watch_.same_process()) return;
  // One check at a time: a request arriving during another's waits for its verdict.
  std::lock_guard lock(check_mutex_);
  if (watch_.same_process()) return;
  watch_.arm();  // first: a restart after this closes it
  if (refresh(true) && ready_) {
    watch_.trust();
  } else {
    watch_.disarm();
  }
}

bool Route::refresh(bool verify_slots) {
  UpstreamProps props;
  std::string error;
  if (!upstream_.props(&props, &error)) {
    verified_ = false;    // whatever comes back is checked again
    slots_.forget_all();  // and holds nothing we know of
    if (error.rfind("HTTP 503", 0) == 0)  // llama-server loading its model
      set_state(UpstreamState::verifying, upstream_.describe() + " is starting: " + error);
    else
      set_state(UpstreamState::unreachable,
                upstream_.describe() + " does not answer GET /props: " + error);
    return false;
  }
  if (!props.slots_endpoint) {
    verified_ = false;
    set_state(UpstreamState::misconfigured,
              upstream_.describe() +
                  " was started with --no-slots: the proxy needs GET /slots (start it without "
                  "--no-slots)");
    return false;
  }
  bool slots_checked = true;
  if (verify_slots) {
    std::vector<SlotReport> reports;
    slots_checked = upstream_.slots(&reports);
    if (slots_checked) {
      slots_.verify(reports);
    } else {
      slots_.forget_all();  // nothing known of what they hold: restores say
    }
  }
  // Digested every time (a stat and a cache read): a new file at the same path must
  // never receive state parked for the old one.
  kvpark_hash128 weights;
  if (llama::digest_model_file(props.model_path, digest_cache_, &weights) !=
      llama::DigestStatus::ok) {
    set_state(UpstreamState::misconfigured,
              upstream_.describe() + " serves " + props.model_path +
                  ", which the proxy cannot read (it digests the model file for the namespace: "
                  "run the proxy where that path is readable)");
    return false;
  }
  // Read once per model file (its digest), not at every check.
  llama::MemoryShape memory = memory_shape_.load();
  bool shape_known = false;
  {
    std::lock_guard lock(mutex_);
    shape_known = memory_digest_known_ && memory_digest_.low == weights.low &&
                  memory_digest_.high == weights.high;
  }
  if (!shape_known) {
    if (llama::read_memory_shape(props.model_path, &memory) != llama::GgufReadStatus::ok) {
      set_state(UpstreamState::misconfigured,
                upstream_.describe() + " serves " + props.model_path +
                    ", whose GGUF metadata the proxy cannot read (it reads what the model's "
                    "memory keeps: run the proxy where that path is readable)");
      return false;
    }
    std::lock_guard lock(mutex_);
    memory_digest_ = weights;
    memory_digest_known_ = true;
  }
  slots_.resize(props.total_slots);
  kvpark_hash128 id;
  {
    std::lock_guard lock(mutex_);
    id = make_namespace(weights, props.build_info, upstream_.options().settings, memory, epoch_);
    const bool same = id.low == namespace_id_.low && id.high == namespace_id_.high;
    model_path_ = props.model_path;
    total_slots_ = props.total_slots;
    if (same && ready_) return slots_checked;
    if (!same) {
      // Refusals counted under another namespace say nothing of this one. An
      // upstream back from a restart keeps its count: the same settings are
      // refused the same way.
      weights_ = weights;
      build_info_ = props.build_info;
      namespace_id_ = id;
      prefill_rate_ = 0;  // another model, build or settings: measured again
      prefixes_.clear();
      refusals_in_a_row_ = 0;
      memory_shape_ = memory;
      restores_discarded_ = false;
      slots_.forget_all();
      verified_ = false;  // another process or model: its slot directory too
      block_shape_.reset();  // learned again by the round trip
      whole_why_ = "not checked yet";
    }
  }
  tell_parking();
  if (!verified_) verify();
  tell_parking();  // the round trip may have learned a block shape
  if (verified_) set_state(UpstreamState::ready, "");
  return slots_checked;
}

UpstreamState Route::state() const {
  std::lock_guard lock(mutex_);
  return state_;
}

std::string Route::state_reason() const {
  std::lock_guard lock(mutex_);
  return reason_;
}

void Route::set_state(UpstreamState state, const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (state == state_ && reason == reason_) return;
    state_ = state;
    reason_ = reason;
    ready_ = state == UpstreamState::ready;
  }
  if (state == UpstreamState::ready)
    std::fprintf(stderr,
                 "kvpark-proxy: upstream %s: %s ready: %s, %u slots, slot files round-trip in %s, "
                 "namespace %s, memory %s%s\n",
                 name().c_str(), upstream_.describe().c_str(), model_path_.c_str(), total_slots_,
                 slot_dir_.c_str(), namespace_hex().c_str(),
                 llama::memory_shape_string(memory_shape()),
                 memory_shape() == llama::MemoryShape::kv_cache
                     ? ""
                     : " (it cannot be trimmed back: turn closures are parked before the reply, "
                       "at their exact end)");
  else
    std::fprintf(stderr, "kvpark-proxy: upstream %s %s: %s; serving it uncached until then\n",
                 name().c_str(), upstream_state_string(state), reason.c_str());
  if (on_state_change_) on_state_change_();
}

void Route::restore_succeeded() {
  std::lock_guard lock(mutex_);
  refusals_in_a_row_ = 0;
}

void Route::note_prefill(kvpark_hash128 id, uint32_t tokens, double msec) {
  if (tokens < prefill_rate_sample_tokens_min || !(msec > 0)) return;
  const double measured = std::min(static_cast<double>(tokens) * 1000.0 / msec,
                                   static_cast<double>(std::numeric_limits<uint32_t>::max()));
  const auto rate = std::max<uint32_t>(1, static_cast<uint32_t>(measured));
  {
    std::lock_guard lock(mutex_);
    const kvpark_hash128 now = block_shape_ != nullptr ? block_shape_->space : namespace_id_;
    if (id.low != now.low || id.high != now.high) return;
    if (prefill_rate_ != 0 && measured < prefill_rate_ * prefill_rate_change_factor &&
        measured * prefill_rate_change_factor > prefill_rate_)
      return;
    prefill_rate_ = rate;
  }
  std::fprintf(stderr, "kvpark-proxy: upstream %s prefills about %u tokens per second\n",
               name().c_str(), rate);
  parking_.declare_prefill_rate(rate);
}

uint32_t Route::prefill_tokens_per_second() const {
  std::lock_guard lock(mutex_);
  return prefill_rate_;
}

void Route::restore_refused() {
  kvpark_hash128 id;
  {
    std::lock_guard lock(mutex_);
    if (++refusals_in_a_row_ < refusals_before_new_epoch) return;
    refusals_in_a_row_ = 0;
    ++epoch_;
    id = make_namespace(weights_, build_info_, upstream_.options().settings, memory_shape_.load(),
                        epoch_);
    namespace_id_ = id;
    if (block_shape_ != nullptr) {  // the same layout, in the fresh namespace
      auto shape = std::make_shared<BlockShape>(*block_shape_);
      shape->space = block_namespace(id, shape->layout, shape->block_tokens);
      block_shape_ = std::move(shape);
    }
  }
  tell_parking();  // the same model: the same rate
  std::fprintf(stderr,
               "kvpark-proxy: upstream %s: %u parked states in a row refused, though slot files "
               "round-trip through %s (llama-server's cache settings differ from what the proxy "
               "was told, --state %s=...; or the entries failed their checksums); parking under "
               "a fresh namespace %s\n",
               name().c_str(), refusals_before_new_epoch, slot_dir_.c_str(), name().c_str(),
               namespace_hex().c_str());
}

kvpark_hash128 Route::namespace_id() const {
  std::lock_guard lock(mutex_);
  return block_shape_ != nullptr ? block_shape_->space : namespace_id_;
}

std::shared_ptr<const BlockShape> Route::block_shape() const {
  std::lock_guard lock(mutex_);
  return block_shape_;
}

std::string Route::parking_mode() const {
  std::lock_guard lock(mutex_);
  return block_shape_ != nullptr ? std::string("blocks") : "whole: " + whole_why_;
}

void Route::tell_parking() {
  // Held across set_namespace: two changes told at once reach Parking in the order
  // they were read, the newest last.
  std::lock_guard telling(tell_mutex_);
  std::shared_ptr<const BlockShape> shape;
  kvpark_hash128 id;
  {
    std::lock_guard lock(mutex_);
    shape = block_shape_;
    id = shape != nullptr ? shape->space : namespace_id_;
  }
  parking_.set_namespace(id, prefill_tokens_per_second(), std::move(shape));
}

std::string Route::namespace_hex() const {
  const kvpark_hash128 id = namespace_id();
  return hex128(Hash128{.low = id.low, .high = id.high});
}

std::string Route::slot_file_name(uint32_t slot_id, const char* purpose) const {
  return file_name_prefix() + std::to_string(slot_id) + "." + purpose;
}

std::string Route::file_name_prefix() const {
  // The pid keeps two proxies sharing one slot directory apart; llama-server takes
  // plain file names only.
  std::string safe = name();
  for (char& c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return "kvpark-" + std::to_string(getpid()) + "-" + std::to_string(index_) + "-" + safe + "-";
}

std::string Route::slot_file_path(const std::string& file_name) const {
  return slot_dir_ + "/" + file_name;
}

void Route::recycle_saved_file(const std::string& path) {
  bool wanted = false;
  for (uint32_t slot = 0; slot < slots_.size() && !wanted; ++slot)
    wanted = access(slot_file_path(slot_file_name(slot, "restore")).c_str(), F_OK) != 0;
  const std::string spare = spare_file_path();
  // rename() replaces an older spare; a slot taking the spare meanwhile takes one or
  // the other whole.
  if (!wanted || rename(path.c_str(), spare.c_str()) != 0) {
    unlink(path.c_str());
    if (!wanted) unlink(spare.c_str());
  }
}

void Route::take_spare_for_restore(uint32_t slot_id) {
  const std::string restore = slot_file_path(slot_file_name(slot_id, "restore"));
  if (access(restore.c_str(), F_OK) == 0) return;
  // No spare (ENOENT) leaves the restore to create its file.
  rename(spare_file_path().c_str(), restore.c_str());
}

std::string Route::spare_file_path() const {
  return slot_file_path(file_name_prefix() + "any.spare");
}

void Counters::observe_forward_delay(double seconds) {
  size_t bucket = 0;
  while (bucket < std::size(forward_delay_bounds_sec) && seconds > forward_delay_bounds_sec[bucket])
    ++bucket;
  ++forward_delay_counts[bucket];
  forward_delay_usec_sum += uint64_t(seconds * 1e6);
}

}  // namespace kvpark::proxy
