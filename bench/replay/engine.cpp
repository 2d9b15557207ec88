// The modeled engine process (see engine.h and docs/replay.md, "Engine model").
//
// Per request: render + tokenize + plan write candidates; LOOKUP; follow another
// engine's in-flight prefill (single flight) or wait for disk promotions; when the
// first position to park is shared and nobody else is prefilling it, lead: reserve
// its blocks and snapshot BEFORE the modeled prefill, then write and seal them
// (snapshot first); copy what the plan restores into private memory and check every
// byte; prefill the rest, parking blocks every publish_chunk_tokens and a snapshot
// at every candidate. An attention-only engine (snapshot_required false) parks and
// restores blocks only, and leads a shared head by reserving its blocks.
#include "bench/replay/engine.h"

#include <signal.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bench/replay/content.h"
#include "bench/replay/prompt.h"

namespace kvpark::replay {
namespace {

constexpr int lookup_attempts_max = 100;     // daemon restarts: 100 x 50 ms
constexpr int follow_rounds_max = 4;         // single-flight waits per lookup
constexpr int lead_attempts_min = 3;  // lookups when another engine wins the head, at least
constexpr uint32_t reserve_blocks_chunk = 1024;  // proto limit: blocks per RESERVE

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

struct Engine {
  const EngineConfig& cfg;
  kvpark_client* client = nullptr;
  uint64_t block_bytes = 0;
  std::vector<uint8_t> private_blocks;    // restored KV, the engine's own memory
  std::vector<uint8_t> private_snapshot;  // restored recurrent state
};

struct Request {
  const Event& event;
  RenderedPrompt prompt;
  std::vector<kvpark_hash128> hashes;  // chain hash per whole block
  std::vector<uint64_t> keys;          // prefix key per position
  uint64_t session = 0;
};

void set_error(Result& r, const char* what, kvpark_status s) {
  r.failed = 1;
  snprintf(r.error, sizeof r.error, "%s: %s", what, kvpark_status_string(s));
}

void sleep_modeled(const EngineConfig& cfg, uint32_t tokens) {
  const double real_ms = double(tokens) * 1000.0 / cfg.prefill_tokens_per_second * cfg.time_scale;
  if (real_ms > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(real_ms));
}

kvpark_status lookup(Engine& e, const Request& q, kvpark_plan** ret_plan) {
  kvpark_status s = KVPARK_UNAVAILABLE;
  for (int i = 0; i < lookup_attempts_max; ++i) {
    s = kvpark_lookup(e.client, q.session, q.prompt.tokens.data(), q.prompt.tokens.size(), ret_plan);
    if (s != KVPARK_UNAVAILABLE) return s;
    usleep(50'000);  // the daemon is restarting; the next call reconnects
  }
  return s;
}

// Reservations of blocks [first, last) of the prompt, in RESERVE-sized pieces.
kvpark_status reserve_blocks(Engine& e, const Request& q, const kvpark_publish_options& options,
                             size_t first, size_t last, std::vector<kvpark_reservation*>& ret) {
  const auto& t = q.prompt.tokens;
  for (size_t b = first; b < last; b += reserve_blocks_chunk) {
    kvpark_reservation* r = nullptr;
    const size_t count = std::min<size_t>(reserve_blocks_chunk, last - b);
    const kvpark_status s = kvpark_reserve_blocks(e.client, &options, t.data(), t.size(), b, count, &r);
    if (s != KVPARK_OK) return s;
    ret.push_back(r);
  }
  return KVPARK_OK;
}

// Writes the computed payload of every granted block, from block `first` on.
void write_blocks(Engine& e, const Request& q, size_t first,
                  const std::vector<kvpark_reservation*>& reservations) {
  size_t block = first;
  for (kvpark_reservation* r : reservations) {
    for (size_t i = 0; i < kvpark_reservation_block_count(r); ++i, ++block) {
      if (void* p = kvpark_reservation_block(r, i)) fill_payload(block_key(q.hashes[block]), p, e.block_bytes);
    }
  }
}

bool seal_all(std::vector<kvpark_reservation*>& reservations) {
  bool ok = true;
  for (kvpark_reservation* r : reservations) ok = kvpark_seal(r) == KVPARK_OK && ok;
  reservations.clear();
  return ok;
}

void abort_all(std::vector<kvpark_reservation*>& reservations) {
  for (kvpark_reservation* r : reservations) kvpark_abort(r);
  reservations.clear();
}

kvpark_publish_options options_for(const Request& q, const Candidate& c) {
  return {.session_id = q.session, .entry_class = c.entry_class, .evidence = c.evidence};
}

void note_published(Result& r, const Candidate& c) {
  if (r.published_count >= published_max) return;
  r.published_position[r.published_count] = c.position;
  r.published_shared[r.published_count] = c.entry_class == KVPARK_CLASS_SHARED;
  ++r.published_count;
}

// Copies the plan's blocks and snapshot into private memory and checks each byte.
void restore(Engine& e, const Request& q, const kvpark_plan* plan, Result& r) {
  const size_t blocks = kvpark_plan_block_count(plan);
  uint64_t snapshot_bytes = 0;
  uint32_t position = 0;
  const void* snapshot = kvpark_plan_snapshot(plan, &snapshot_bytes, &position);
  if (e.private_blocks.size() < blocks * e.block_bytes) e.private_blocks.resize(blocks * e.block_bytes);
  if (e.private_snapshot.size() < snapshot_bytes) e.private_snapshot.resize(snapshot_bytes);
  const double start = now_ms();
  // The verifying copies: what lands in private memory is what was sealed, or a miss.
  auto* p = const_cast<kvpark_plan*>(plan);
  bool verified = true;
  for (size_t i = 0; verified && i < blocks; ++i) {
    verified = kvpark_plan_copy_block(p, i, e.private_blocks.data() + i * e.block_bytes) == KVPARK_OK;
  }
  if (verified && snapshot != nullptr) {
    verified = kvpark_plan_copy_snapshot(p, e.private_snapshot.data(), snapshot_bytes) == KVPARK_OK;
  }
  r.restore_ms = now_ms() - start;
  // The strict serial reference: the same prefix computed from scratch.
  bool same = verified && blocks <= q.hashes.size();
  for (size_t i = 0; same && i < blocks; ++i) {
    same = payload_matches(block_key(q.hashes[i]), e.private_blocks.data() + i * e.block_bytes, e.block_bytes);
  }
  if (!e.cfg.snapshot_required) {
    same = same && blocks * e.cfg.block_tokens == r.cached_tokens;
  } else if (r.cached_tokens > 0) {
    same = same && snapshot != nullptr && position == r.cached_tokens &&
           snapshot_bytes == e.cfg.snapshot_bytes && position <= q.keys.size() &&
           payload_matches(q.keys[position], e.private_snapshot.data(), snapshot_bytes);
  }
  r.byte_identical = same ? 1 : 0;
}

Result serve(Engine& e, const Event& event, const Job& job) {
  Result r;
  r.request = job.request;
  const EngineConfig& cfg = e.cfg;
  Request q{.event = event};
  std::string error;
  if (!render_request(event.body, cfg.automatic_system_candidate, q.prompt, error)) {
    r.failed = 1;
    snprintf(r.error, sizeof r.error, "render: %s", error.c_str());
    return r;
  }
  const auto& tokens = q.prompt.tokens;
  const auto n = static_cast<uint32_t>(tokens.size());
  r.prompt_tokens = n;
  q.session = fnv1a64(event.conversation);
  q.hashes.resize(n / cfg.block_tokens);
  kvpark_chain_hashes({cfg.namespace_low, 0}, tokens.data(), cfg.block_tokens, q.hashes.size(), q.hashes.data());
  q.keys = prefix_keys(cfg.namespace_low, tokens);

  kvpark_plan* plan = nullptr;
  std::vector<Candidate> pending;
  std::vector<kvpark_reservation*> head_blocks;
  kvpark_reservation* head_snapshot = nullptr;
  uint32_t cached = 0;
  double waited_real = 0;
  bool first_lookup = true;
  double lead_deadline_ms = 0;
  for (int attempt = 0;; ++attempt) {
    kvpark_status s = lookup(e, q, &plan);
    if (s != KVPARK_OK) return set_error(r, "lookup", s), r;
    if (first_lookup) r.inflight_tokens = kvpark_plan_inflight_tokens(plan);
    first_lookup = false;
    // Single flight: another engine is prefilling part of this prompt; wait at most
    // as long as prefilling it ourselves would take, in unscaled real time (what the
    // daemon allows a follower too). The leader sleeps only the scaled time, so a
    // leader that a loaded machine runs late still seals within the deadline: the
    // run judges single flight, not this machine's scheduling. Lateness shows up as
    // wait time in the figures.
    for (int round = 0; round < follow_rounds_max && kvpark_plan_inflight_tokens(plan) > 0; ++round) {
      r.followed = 1;
      const double modeled = double(kvpark_plan_inflight_tokens(plan)) * 1000.0 / cfg.prefill_tokens_per_second;
      const auto timeout = static_cast<uint32_t>(std::ceil(std::max(modeled, modeled * cfg.time_scale))) + 1;
      const double start = now_ms();
      s = kvpark_plan_wait(plan, timeout);
      waited_real += now_ms() - start;
      if (s != KVPARK_OK) break;  // timeout or error: prefill alone
    }
    // Disk promotions: real I/O, bounded by the unscaled prefill time it saves.
    if (kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan)) {
      const uint32_t more = kvpark_plan_pending_tokens(plan) - kvpark_plan_restorable_tokens(plan);
      const auto timeout = static_cast<uint32_t>(double(more) * 1000.0 / cfg.prefill_tokens_per_second) + 1;
      const double start = now_ms();
      (void)kvpark_plan_wait(plan, timeout);
      r.promote_ms += now_ms() - start;
    }
    cached = kvpark_plan_restorable_tokens(plan);
    // Promotions slower than the prefill they save are left to land for later
    // requests: the daemon offered these tokens, this machine was too slow to take them.
    const uint32_t offered = kvpark_plan_pending_tokens(plan);
    r.promoting_tokens = offered > cached ? offered - cached : 0;
    r.capture_hint = kvpark_plan_capture_hint(plan);
    pending.clear();
    for (const Candidate& c : q.prompt.candidates) {
      if (c.position > cached) pending.push_back(c);
    }
    const uint32_t hint = r.capture_hint;
    // The daemon tracks recurrence per chunk, so its hint is a block boundary at or
    // before where sessions diverge. When the planner found a shared head of its own
    // (the system frontier), that head is what sibling engines reserve and follow: a
    // second snapshot at the hint would be a second key for the same head, and two
    // engines could each lead one and prefill the head twice. The hint is for the
    // requests the planner cannot read (no role information, automatic candidate off).
    const auto shared_head = [&](const Candidate& c) {
      return c.entry_class == KVPARK_CLASS_SHARED && c.position >= hint;
    };
    if (cfg.honour_capture_hint && hint > cached + cfg.block_tokens && hint < n &&
        std::none_of(pending.begin(), pending.end(), shared_head)) {
      pending.push_back({.position = hint, .entry_class = KVPARK_CLASS_SHARED,
                         .evidence = KVPARK_EVIDENCE_OBSERVED_RECURRENCE, .rule = "capture-hint"});
      std::sort(pending.begin(), pending.end(),
                [](const Candidate& a, const Candidate& b) { return a.position < b.position; });
      r.hint_captured = 1;
    }
    if (pending.empty() || pending[0].entry_class != KVPARK_CLASS_SHARED) break;
    // Lead: the snapshot reservation decides who prefills the shared head (without
    // snapshots, its blocks do: granted ones are ours, NULL ones another's).
    const Candidate& head = pending[0];
    const kvpark_publish_options options = options_for(q, head);
    if (!cfg.snapshot_required) {
      s = reserve_blocks(e, q, options, cached / cfg.block_tokens, head.position / cfg.block_tokens, head_blocks);
      if (s != KVPARK_OK) ++r.publish_failures;
      bool others_write_them = head.position / cfg.block_tokens > cached / cfg.block_tokens;
      for (kvpark_reservation* hr : head_blocks) {
        for (size_t i = 0; i < kvpark_reservation_block_count(hr); ++i) {
          others_write_them = others_write_them && kvpark_reservation_block(hr, i) == nullptr;
        }
      }
      if (s != KVPARK_OK || !others_write_them) {
        r.led = 1;
        break;
      }
      abort_all(head_blocks);
      s = KVPARK_IN_FLIGHT;
    } else {
      s = kvpark_reserve_snapshot(e.client, &options, tokens.data(), head.position, cfg.snapshot_bytes,
                                  &head_snapshot);
    }
    if (s == KVPARK_OK) {
      s = reserve_blocks(e, q, options, cached / cfg.block_tokens, head.position / cfg.block_tokens, head_blocks);
      if (s != KVPARK_OK) ++r.publish_failures;
      r.led = 1;
      break;
    }
    head_snapshot = nullptr;
    if (s != KVPARK_IN_FLIGHT && s != KVPARK_ALREADY_PRESENT) {
      ++r.publish_failures;
      break;
    }
    // The leader holds the head's snapshot but may not have reserved its blocks yet
    // (a loaded machine can run it late between the two): keep looking for as long as
    // prefilling the head ourselves would take, unscaled, like a follower's wait.
    if (attempt == 0) {
      const double modeled = double(head.position - cached) * 1000.0 / cfg.prefill_tokens_per_second;
      lead_deadline_ms = now_ms() + std::max(modeled, modeled * cfg.time_scale);
    }
    if (attempt + 1 >= lead_attempts_min && now_ms() >= lead_deadline_ms) break;
    // Another engine leads (or just sealed): look up again and follow it.
    kvpark_plan_release(plan);
    plan = nullptr;
    usleep(1000);
  }
  if (cfg.inflight_is_remote) {
    r.remote_ms = waited_real;
  } else {
    r.wait_ms = waited_real / cfg.time_scale;
  }
  r.cached_tokens = cached;
  r.reuse_kind = kvpark_plan_reuse_kind(plan);
  restore(e, q, plan, r);
  kvpark_plan_release(plan);

  // Prefill from `cached` to the end, parking at each candidate.
  uint32_t at = cached;
  size_t blocks_parked = cached / cfg.block_tokens;
  double publish_real = 0;
  size_t next = 0;
  if (r.led) {
    const Candidate& head = pending[0];
    sleep_modeled(cfg, head.position - at);
    const double start = now_ms();
    write_blocks(e, q, blocks_parked, head_blocks);
    bool ok = true;
    if (head_snapshot != nullptr) {  // the snapshot first, then its blocks
      fill_payload(q.keys[head.position], kvpark_reservation_snapshot(head_snapshot), cfg.snapshot_bytes);
      ok = kvpark_seal(head_snapshot) == KVPARK_OK;
    }
    ok = seal_all(head_blocks) && ok;
    publish_real += now_ms() - start;
    if (ok) note_published(r, head);
    else ++r.publish_failures;
    at = head.position;
    blocks_parked = head.position / cfg.block_tokens;
    next = 1;
  }
  for (; next < pending.size(); ++next) {
    const Candidate& c = pending[next];
    const kvpark_publish_options options = options_for(q, c);
    bool ok = true;
    while (at < c.position) {
      const uint32_t step = std::min(c.position, (at / cfg.publish_chunk_tokens + 1) * cfg.publish_chunk_tokens);
      sleep_modeled(cfg, step - at);
      at = step;
      const size_t blocks_now = at / cfg.block_tokens;
      if (blocks_now > blocks_parked) {
        const double start = now_ms();
        std::vector<kvpark_reservation*> rs;
        if (reserve_blocks(e, q, options, blocks_parked, blocks_now, rs) == KVPARK_OK) {
          write_blocks(e, q, blocks_parked, rs);
          ok = seal_all(rs) && ok;
        } else {
          abort_all(rs);
          ok = false;
        }
        blocks_parked = blocks_now;
        publish_real += now_ms() - start;
      }
    }
    const double start = now_ms();
    kvpark_reservation* snap = nullptr;
    kvpark_status s = KVPARK_ALREADY_PRESENT;  // no snapshots: the blocks above are the state
    if (cfg.snapshot_required) {
      s = kvpark_reserve_snapshot(e.client, &options, tokens.data(), c.position, cfg.snapshot_bytes, &snap);
    }
    if (s == KVPARK_OK) {
      fill_payload(q.keys[c.position], kvpark_reservation_snapshot(snap), cfg.snapshot_bytes);
      ok = kvpark_seal(snap) == KVPARK_OK && ok;
    } else if (s != KVPARK_ALREADY_PRESENT && s != KVPARK_IN_FLIGHT) {
      ok = false;
    }
    publish_real += now_ms() - start;
    if (ok) note_published(r, c);
    else ++r.publish_failures;
  }
  sleep_modeled(cfg, n - at);
  r.publish_ms = publish_real;
  r.prefill_tokens = n - cached;
  r.prefill_ms = double(n - cached) * 1000.0 / cfg.prefill_tokens_per_second;
  r.ttft_ms = r.wait_ms + r.promote_ms + r.remote_ms + r.restore_ms + r.prefill_ms;
  return r;
}

bool read_full(int fd, void* data, size_t bytes) {
  auto* p = static_cast<uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t got = read(fd, p, bytes);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    bytes -= size_t(got);
  }
  return true;
}

}  // namespace

void engine_main(const EngineConfig& config, const std::vector<Event>& events, uint32_t engine_index,
                 int job_fd, int result_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  Engine e{.cfg = config, .block_bytes = uint64_t{config.block_tokens} * config.bytes_per_token};
  const std::string name = "kvpark-replay-engine-" + std::to_string(engine_index);
  kvpark_namespace ns{};
  ns.id = {config.namespace_low, 0};
  ns.block_tokens = config.block_tokens;
  ns.block_payload_bytes = e.block_bytes;
  ns.snapshot_required = config.snapshot_required ? 1 : 0;
  ns.prefill_tokens_per_second = config.prefill_tokens_per_second;
  ns.client_name = name.c_str();
  kvpark_status s = KVPARK_UNAVAILABLE;
  for (int i = 0; i < lookup_attempts_max && s == KVPARK_UNAVAILABLE; ++i) {
    s = kvpark_connect(config.socket_path.c_str(), &ns, &e.client);
    if (s == KVPARK_UNAVAILABLE) usleep(50'000);
  }
  Job job;
  while (read_full(job_fd, &job, sizeof job)) {
    Result r;
    if (s != KVPARK_OK) {
      set_error(r, "connect", s);
      r.request = job.request;
    } else {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      const uint64_t now_nsec = uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
      r = serve(e, events[job.request], job);
      r.queue_ms = now_nsec > job.dispatched_nsec ? double(now_nsec - job.dispatched_nsec) / 1e6 : 0;
    }
    if (write(result_fd, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) break;
  }
  if (e.client != nullptr) kvpark_disconnect(e.client);
  _exit(0);
}

}  // namespace kvpark::replay
