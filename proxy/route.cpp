#include "proxy/route.h"

#include <unistd.h>
#include <xxhash.h>

#include <cctype>
#include <cinttypes>
#include <cstdio>

#include "integrations/llama/weights_digest.h"

namespace kvpark::proxy {
namespace {

constexpr auto refresh_interval = std::chrono::seconds(5);
constexpr size_t frontier_cache_entries_max = 4096;  // distinct heads remembered
constexpr uint32_t namespace_format_version = 1;     // bump when the fields below change
// llama-server refusing this many parked states in a row, with no restore between,
// means the namespace is wrong for it (a state-shaping flag the proxy was not told);
// one refusal may be passing (a full KV cache gives the same error).
constexpr uint32_t refusals_before_new_epoch = 2;

// XXH3-128 over the fields that decide whether a slot file restores: the weights,
// the llama.cpp build (its state format) and the operator's state-relevant flags.
kvpark_hash128 make_namespace(kvpark_hash128 weights, const std::string& build_info,
                              const std::string& settings, uint32_t epoch) {
  std::string fields = "kvparkpx";
  auto add = [&](const void* p, size_t n) { fields.append(static_cast<const char*>(p), n); };
  add(&namespace_format_version, sizeof namespace_format_version);
  add(&weights.low, sizeof weights.low);
  add(&weights.high, sizeof weights.high);
  const uint64_t build_bytes = build_info.size();
  add(&build_bytes, sizeof build_bytes);
  fields += build_info;
  fields += settings;
  add(&epoch, sizeof epoch);
  const XXH128_hash_t h = XXH3_128bits(fields.data(), fields.size());
  return kvpark_hash128{.low = h.low64, .high = h.high64};
}

}  // namespace

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

Route::Route(const UpstreamOptions& upstream, const ProxyOptions& options, size_t index)
    : upstream_(upstream),
      parking_(options.socket_path, "kvpark-proxy/" + upstream.name),
      slot_dir_(options.slot_dir),
      index_(index),
      digest_cache_(options.digest_cache.empty() ? llama::default_cache_dir()
                                                 : options.digest_cache) {
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
  while (!stopping_) {
    watch_wake_.wait_for(lock, refresh_interval, [&] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    refresh(true);
    lock.lock();
  }
}

void Route::refresh(bool verify_slots) {
  UpstreamProps props;
  std::string error;
  if (!upstream_.props(&props, &error)) {
    if (ready_.exchange(false))
      std::fprintf(stderr, "kvpark-proxy: upstream %s: %s; serving it uncached\n", name().c_str(),
                   error.c_str());
    slots_.forget_all();  // whatever comes back holds nothing we know of
    return;
  }
  if (verify_slots) {
    std::vector<SlotReport> reports;
    if (upstream_.slots(&reports)) slots_.verify(reports);
  }
  // Digested every time (a stat and a cache read): a new file at the same path must
  // never receive state parked for the old one.
  kvpark_hash128 weights;
  if (llama::digest_model_file(props.model_path, digest_cache_, &weights) !=
      llama::DigestStatus::ok) {
    if (ready_.exchange(false))
      std::fprintf(stderr,
                   "kvpark-proxy: upstream %s: cannot read its model file %s (the proxy digests "
                   "it for the namespace); serving it uncached\n",
                   name().c_str(), props.model_path.c_str());
    return;
  }
  slots_.resize(props.total_slots);
  kvpark_hash128 id;
  {
    std::lock_guard lock(mutex_);
    id = make_namespace(weights, props.build_info, upstream_.options().settings, epoch_);
    const bool same = id.low == namespace_id_.low && id.high == namespace_id_.high;
    if (same && ready_) return;
    if (!same) {
      // Refusals counted under another namespace say nothing of this one. An
      // upstream back from a restart keeps its count: the same settings are
      // refused the same way.
      weights_ = weights;
      build_info_ = props.build_info;
      namespace_id_ = id;
      frontiers_.clear();
      refusals_in_a_row_ = 0;
      slots_.forget_all();
    }
  }
  parking_.set_namespace(id, 0);
  ready_ = true;
  std::fprintf(stderr, "kvpark-proxy: upstream %s: %s, %u slots, namespace %s\n", name().c_str(),
               props.model_path.c_str(), props.total_slots, namespace_hex().c_str());
}

void Route::restore_succeeded() {
  std::lock_guard lock(mutex_);
  refusals_in_a_row_ = 0;
}

void Route::restore_refused() {
  kvpark_hash128 id;
  {
    std::lock_guard lock(mutex_);
    if (++refusals_in_a_row_ < refusals_before_new_epoch) return;
    refusals_in_a_row_ = 0;
    ++epoch_;
    id = make_namespace(weights_, build_info_, upstream_.options().settings, epoch_);
    namespace_id_ = id;
  }
  parking_.set_namespace(id, 0);
  std::fprintf(stderr,
               "kvpark-proxy: upstream %s: %u parked states in a row refused (by llama-server: its "
               "cache settings differ from what the proxy was told, --state %s=...; or by their "
               "checksums); parking under a fresh namespace %s\n",
               name().c_str(), refusals_before_new_epoch, name().c_str(), namespace_hex().c_str());
}

kvpark_hash128 Route::namespace_id() const {
  std::lock_guard lock(mutex_);
  return namespace_id_;
}

std::string Route::namespace_hex() const {
  const kvpark_hash128 id = namespace_id();
  char text[33];
  std::snprintf(text, sizeof text, "%016" PRIx64 "%016" PRIx64, id.high, id.low);
  return text;
}

std::string Route::slot_file_name(uint32_t slot_id, const char* purpose) const {
  // The pid keeps two proxies sharing one slot directory apart; llama-server takes
  // plain file names only.
  std::string safe = name();
  for (char& c : safe)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  return "kvpark-" + std::to_string(getpid()) + "-" + std::to_string(index_) + "-" + safe + "-" +
         std::to_string(slot_id) + "." + purpose;
}

std::string Route::slot_file_path(const std::string& file_name) const {
  return slot_dir_ + "/" + file_name;
}

Route::Frontier Route::cached_frontier(uint64_t head_key) {
  std::lock_guard lock(mutex_);
  auto it = frontiers_.find(head_key);
  return it == frontiers_.end() ? Frontier{} : it->second;
}

void Route::remember_frontier(uint64_t head_key, Frontier frontier) {
  std::lock_guard lock(mutex_);
  if (frontiers_.size() >= frontier_cache_entries_max) frontiers_.clear();
  frontiers_[head_key] = frontier;
}

}  // namespace kvpark::proxy
