// One upstream as the proxy serves it: the llama-server, its slots, its kvparkd
// namespace, and the heads being prefilled right now (single flight).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "integrations/llama/gguf_memory.h"
#include "proxy/options.h"
#include "proxy/parking.h"
#include "proxy/process_watch.h"
#include "proxy/prompt_prefixes.h"
#include "proxy/slot_pool.h"
#include "proxy/upstream.h"
#include "proxy/wire_formats.h"

namespace kvpark::proxy {

// How a request's prompt was had: the X-Kvpark-Reuse values, and /metrics labels.
enum class ReuseKind { root, shared_stable_prefix, private_turn_closure, slot, uncached, count };
const char* reuse_kind_string(ReuseKind kind);

// Why a parked state was not restored (the request was prefilled instead).
enum class RestoreFailure {
  checksum,       // the payload failed the proxy's checks
  refused,        // llama-server refused it, though slot files round-trip
  slot_file,      // the proxy could not write the slot file
  misconfigured,  // the upstream failed its slot-file round trip: not the state's fault
  discarded,      // restored, but llama-server prefilled those tokens again (below)
  count
};
const char* restore_failure_string(RestoreFailure cause);

struct Counters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> uncached_requests{0};  // served without kvparkd
  std::atomic<uint64_t> head_prefills{0};      // heads prefilled alone and parked
  std::atomic<uint64_t> head_waits{0};         // requests that waited for another's head
  std::atomic<uint64_t> restores{0};
  std::atomic<uint64_t> restore_failures{0};   // parked state refused: prefilled instead
  std::atomic<uint64_t> publishes{0};
  // Requests (chat, or passed through) whose client hung up before the whole answer
  // was sent: the upstream's request was abandoned (a generation cancelled).
  std::atomic<uint64_t> abandoned{0};
  // Requests answered, by how their prompt was had, and their prompt tokens: all of
  // them, those prefilled on their behalf (a head they led included), those restored
  // from kvparkd, and those reported as cached_tokens (prompt - prefilled).
  std::atomic<uint64_t> answered[size_t(ReuseKind::count)] = {};
  std::atomic<uint64_t> prompt_tokens{0};
  std::atomic<uint64_t> prefilled_tokens{0};
  std::atomic<uint64_t> restored_tokens{0};
  std::atomic<uint64_t> cached_tokens{0};
  std::atomic<uint64_t> failures[size_t(RestoreFailure::count)] = {};
  // How requests were forwarded: on known prefix tokens, with no upstream call first
  // (fast), after rendering and tokenizing (full); and fast ones whose full
  // tokenization, made after the response, did not start with the known prefix.
  std::atomic<uint64_t> forwarded_fast{0};
  std::atomic<uint64_t> forwarded_full{0};
  std::atomic<uint64_t> prefix_mismatches{0};
  // Saved slot files not parked because they failed the block shape's checks (media
  // chunks, a token list other than the prompt's): each logged.
  std::atomic<uint64_t> slot_files_not_split{0};
  // By front door (Api): requests received, answered 200, and the answered ones'
  // prompt, prefilled and cached tokens (the figures above, split by wire format).
  std::atomic<uint64_t> api_requests[size_t(Api::count)] = {};
  std::atomic<uint64_t> api_answered[size_t(Api::count)] = {};
  std::atomic<uint64_t> api_prompt_tokens[size_t(Api::count)] = {};
  std::atomic<uint64_t> api_prefilled_tokens[size_t(Api::count)] = {};
  std::atomic<uint64_t> api_cached_tokens[size_t(Api::count)] = {};
  // Messages system texts whose per-request billing stamp (cch=) was normalised.
  std::atomic<uint64_t> billing_headers_normalized{0};
  // Time in the proxy from a chat request's arrival to its forwarding, by bucket.
  static constexpr double forward_delay_bounds_sec[] = {0.0005, 0.001, 0.002, 0.003, 0.005,
                                                        0.01,   0.02,  0.05,  0.1,   0.5,
                                                        1,      5};
  static constexpr size_t forward_delay_buckets = std::size(forward_delay_bounds_sec) + 1;
  std::atomic<uint64_t> forward_delay_counts[forward_delay_buckets] = {};
  std::atomic<uint64_t> forward_delay_usec_sum{0};
  void observe_forward_delay(double seconds);
};

// Where an upstream stands. Only `ready` upstreams get slot state restored or parked;
// requests to the others are forwarded uncached.
enum class UpstreamState {
  verifying,      // reachable (or loading its model); the round trip has not run yet
  ready,          // verified: reachable, slots enabled, slot files round-trip, model known
  unreachable,    // no answer, or not llama-server
  misconfigured,  // answers, but cannot be served cached (the reason says what to fix)
};
const char* upstream_state_string(UpstreamState state);

// Requests that need the same head prefilled: the first leads, the rest wait. Keyed
// by namespace and head, so upstreams serving one model share their flights.
class HeadFlights {
 public:
  // True: the caller leads and must call finish(key). False: another request led
  // and has finished (or timeout_msec passed); look up again.
  bool lead_or_wait(uint64_t key, uint32_t timeout_msec);
  void finish(uint64_t key);

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  std::map<uint64_t, uint64_t> leading_;  // key -> generation
  uint64_t generation_ = 0;
};

// Slot file sizes: llama-server's state for n tokens is a fixed part plus a part per
// token, so two saves of different lengths predict the next. Any save that
// disagrees restarts the fit (a sliding-window cache, say, is not linear).
class SlotFileSizes {
 public:
  void observe(uint32_t tokens, uint64_t bytes);
  uint64_t predict(uint32_t tokens) const;  // 0: no prediction

 private:
  uint64_t predict_locked(uint32_t tokens) const;
  mutable std::mutex mutex_;
  uint32_t tokens_[2] = {0, 0};  // two saves of different lengths, the latest second
  uint64_t bytes_[2] = {0, 0};
  int known_ = 0;
};

class Route {
 public:
  // index: the upstream's place in the options, which keeps slot file names apart.
  // on_state_change runs (on any thread) after the state changed.
  Route(const UpstreamOptions& upstream, const ProxyOptions& options, size_t index,
        std::function<void()> on_state_change = {});
  ~Route();
  Route(const Route&) = delete;
  Route& operator=(const Route&) = delete;

  Upstream& upstream() { return upstream_; }
  SlotPool& slots() { return slots_; }
  Parking& parking() { return parking_; }
  SlotFileSizes& slot_file_sizes() { return sizes_; }
  const std::string& name() const { return upstream_.options().name; }
  const std::string& url() const { return upstream_.options().url; }

  // Checks /props and the model file now: a new model, file or build gives a new
  // namespace; with verify_slots, GET /slots drops beliefs a restart made wrong.
  // Run by check_process() and every refresh interval by a watcher thread. An
  // upstream not verified since it was last seen away, or under a new namespace, is
  // verified (verify()) before it is ready. false: /props or, with verify_slots,
  // GET /slots did not answer (slot beliefs are then dropped).
  bool refresh(bool verify_slots);
  // Before every request: while the upstream is the process last checked (its
  // ProcessWatch witness is open and trusted) nothing is asked of it; otherwise
  // refresh(true) now, with a new witness armed first and trusted only once the
  // refresh passed. One check runs at a time; others wait for its verdict.
  void check_process();
  // The upstream failed to answer: check it again before the next request.
  void forget_process() { watch_.disarm(); }
  // True when the upstream is watched and still the process last checked: slot
  // beliefs need no GET /slots.
  bool same_process() { return watch_.same_process(); }
  bool ready() const { return ready_.load(); }
  UpstreamState state() const;
  std::string state_reason() const;  // what to fix; "" when ready
  // A slot action failed in a way the round trip would catch (a save llama-server
  // does not support, a refused restore): checks the slot-file round trip again in
  // `slot`, which the caller holds (its contents are then unknown). false: the
  // upstream is misconfigured now (logged, not ready, re-verified by the watcher).
  bool recheck_with_slot(uint32_t slot);

  // Requests routed here and not finished: those waiting for a head another request
  // prefills, or for a slot, count too, so routing spreads a fan-out.
  uint32_t load() const { return in_progress_.load(); }
  void begin_request() { ++in_progress_; }
  void end_request() { --in_progress_; }
  // How restores went. Refusals in a row (llama-server refusing a state, or a
  // payload failing its checks) move the upstream to a fresh namespace (an epoch in
  // the hash), so a setting the operator left out of --state, or a damaged entry
  // that kvparkd keeps serving, costs two prefills, not one per request.
  void restore_succeeded();
  void restore_refused();
  // What the model's memory keeps (integrations/llama/gguf_memory.h), read with the
  // namespace: only a KV cache can be trimmed back, so only its turn closures are
  // parked after the reply (holding the reply past their key); any other memory's
  // before it, at their exact end (chat.cpp, park_closure_before_reply).
  llama::MemoryShape memory_shape() const { return memory_shape_.load(); }
  // A restore into this upstream was discarded: llama-server prefilled the restored
  // tokens again, as it does when its memory cannot continue from a state loaded at
  // that point (the pinned build judges an iSWA window one token too short). Restores
  // into it stop until its namespace changes: each would cost the copy and save
  // nothing. Returns true for the first one (logged).
  bool restore_discarded() { return !restores_discarded_.exchange(true); }
  bool restores_discarded() const { return restores_discarded_.load(); }
  // A prefill of `tokens` that took `msec` (llama-server's timings) under namespace
  // `id`: the upstream's prefill rate, declared to kvparkd when first measured and
  // again when it moves by more than prefill_rate_change_factor; ignored when the
  // namespace has changed since (another model's rate). Blocks for a kvparkd round trip
  // when it declares: call it after the response.
  void note_prefill(kvpark_hash128 id, uint32_t tokens, double msec);
  uint32_t prefill_tokens_per_second() const;
  // The namespace states are parked in: with a block shape, that shape's space.
  std::string namespace_hex() const;
  kvpark_hash128 namespace_id() const;
  // How its slot files are parked: as blocks of this shape, or whole (nullptr).
  std::shared_ptr<const BlockShape> block_shape() const;
  // "blocks", or "whole: <why the self-check did not split them>".
  std::string parking_mode() const;

  // The slot directory path of a file for slot_id ("save" or "restore").
  std::string slot_file_name(uint32_t slot_id, const char* purpose) const;
  std::string slot_file_path(const std::string& file_name) const;
  // A saved slot file whose state is parked: kept as the spare while some slot has no
  // restore file yet, so that slot's first restore writes over its pages (hundreds of
  // megabytes on tmpfs) instead of allocating them afresh; removed otherwise.
  void recycle_saved_file(const std::string& path);
  // Before slot_id's restore: a slot with no restore file takes the spare as its own.
  void take_spare_for_restore(uint32_t slot_id);

  // Token ids of prefixes (heads, turn closures) rendered through this upstream
  // under its current namespace; dropped when the namespace changes.
  PromptPrefixes& prefixes() { return prefixes_; }

 private:
  void watch();
  void verify();
  std::string file_name_prefix() const;  // of every slot file of this route
  std::string spare_file_path() const;   // recycle_saved_file()'s spare
  void set_state(UpstreamState state, const std::string& reason);
  // The slot-file round trip in `slot` (held): false with what to fix. It also learns
  // whether the slot files can be parked as blocks (state_blocks.h).
  bool round_trip(uint32_t slot, std::string* ret_why);
  // The namespace, effective (blocks) or not, told to Parking; mutex_ held by none.
  void tell_parking();
  // Installs what the round trip learned: the shape's space is derived from the
  // namespace as it is now (an epoch moved on during the round trip counts).
  void learned_shape(std::shared_ptr<const BlockShape> shape, const std::string& whole_why);
  kvpark_hash128 base_namespace() const;  // of whole slot files

 public:
  // A slot file saved here did not have the layout of the block shape whose space is
  // `checked_space` (llama-server restarted with other cache settings): while that is
  // still the upstream's shape, the upstream is not ready (served uncached) until the
  // round trip has checked its slot files again. A shape learned since stands.
  void slot_layout_changed(kvpark_hash128 checked_space);

 private:

  Upstream upstream_;
  SlotPool slots_;
  Parking parking_;
  SlotFileSizes sizes_;
  const std::string slot_dir_;
  const bool park_blocks_;  // --park-as blocks
  const size_t index_;
  const std::string digest_cache_;

  mutable std::mutex mutex_;
  kvpark_hash128 weights_{};
  std::string build_info_;
  uint32_t epoch_ = 0;             // not persisted: a restarted proxy finds out again
  uint32_t refusals_in_a_row_ = 0;
  uint32_t prefill_rate_ = 0;  // tokens per second declared to kvparkd; 0: not measured
  kvpark_hash128 namespace_id_{};  // of whole slot files; blocks: block_shape_->space
  std::shared_ptr<const BlockShape> block_shape_;  // learned by the round trip
  std::string whole_why_ = "not checked yet";      // why slot files are parked whole
  std::atomic<bool> ready_{false};
  std::string model_path_;  // as /props names it
  uint32_t total_slots_ = 0;
  UpstreamState state_ = UpstreamState::verifying;
  std::string reason_ = "not checked yet";
  std::atomic<bool> verified_{false};  // the round trip passed since last seen away
  std::mutex verify_mutex_;            // one round trip at a time
  std::mutex tell_mutex_;  // tell_parking() calls in turn: the last one told is the newest
  std::chrono::steady_clock::time_point last_verify_{};  // under verify_mutex_
  std::function<void()> on_state_change_;
  std::atomic<uint32_t> in_progress_{0};
  std::atomic<llama::MemoryShape> memory_shape_{llama::MemoryShape::kv_cache};
  kvpark_hash128 memory_digest_{};  // the model file whose metadata gave the shape
  bool memory_digest_known_ = false;
  std::atomic<bool> restores_discarded_{false};
  PromptPrefixes prefixes_;
  ProcessWatch watch_;
  std::mutex check_mutex_;  // one check_process() at a time

  std::mutex watch_mutex_;
  std::condition_variable watch_wake_;
  bool stopping_ = false;
  std::thread watcher_;
};

}  // namespace kvpark::proxy
