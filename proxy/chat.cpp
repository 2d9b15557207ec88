// POST /v1/chat/completions, /v1/responses, /v1/messages: the request flow of
// kvpark-proxy (docs/proxy.md). Each front door's body becomes the Chat Completions
// body llama-server renders it as (wire_formats.h); the flow below runs on that.
//
//   render + tokenize through the upstream -> plan the writes (system/tools head,
//   turn closure) -> look up kvparkd -> head single flight (prefill the head alone,
//   save, park as shared) -> take a slot, restore the parked state into it unless
//   it holds as much -> forward pinned to the slot -> after the response: save the
//   slot, park it as this conversation's turn -> give the slot back.
//
// Every kvparkd or slot-file failure degrades to a prefill; only the upstream's own
// answer (or its absence: 502) reaches the client.
#include <httplib.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <atomic>
#include <mutex>
#include <set>

#include "client/kvpark_planner.h"
#include "proxy/json.h"
#include "proxy/proxy.h"
#include "proxy/relay.h"
#include "proxy/turn.h"

namespace kvpark::proxy {
namespace {

constexpr uint32_t head_wait_msec_max = 600'000;  // a follower gives up on its leader
constexpr uint32_t promotion_wait_msec = 2'000;   // for parked state coming back from disk
constexpr int head_attempts_max = 3;              // lead-or-follow rounds before prefilling
constexpr int32_t probe_token = -1;               // a token id no tokenizer gives
// A closure parked before the reply leaves this many of the prompt's tokens to the
// request: prefilled as a batch, they give the logits llama-server's own prefill of
// the whole prompt gives (a lone last token takes another kernel path and moves them
// by about 1e-3), for a few tokens more prefilled by the next turn.
constexpr uint32_t proxy_closure_tail_tokens = 16;
// Stand-in contents that differ in their first character: where two renderings
// with them part is where the message's content starts.
constexpr const char* standin_a = "a";
constexpr const char* standin_b = "b";

// The request with its messages replaced by messages[0, keep) plus one stand-in
// message of `role`, rendered for the template only (no streaming).
std::string standin_body(const rapidjson::Document& request, size_t keep, const char* role,
                         const char* content) {
  rapidjson::Document doc;
  doc.CopyFrom(request, doc.GetAllocator());
  auto& a = doc.GetAllocator();
  rapidjson::Value messages(rapidjson::kArrayType);
  const auto& original = request["messages"];
  for (size_t i = 0; i < keep; ++i)
    messages.PushBack(rapidjson::Value(original[rapidjson::SizeType(i)], a), a);
  rapidjson::Value standin(rapidjson::kObjectType);
  standin.AddMember("role", rapidjson::Value(role, a), a);
  standin.AddMember("content", rapidjson::Value(content, a), a);
  messages.PushBack(standin, a);
  doc["messages"] = messages;
  doc.RemoveMember("stream");
  return to_json(doc);
}

// The tokens before the content of a stand-in message that follows messages[0, keep):
// what every conversation continuing those messages with a `role` message renders.
std::vector<int32_t> tokens_before_content(Upstream& upstream, const rapidjson::Document& request,
                                           size_t keep, const char* role) {
  std::vector<int32_t> a, b;
  Reply failure;
  if (!upstream.chat_tokens(standin_body(request, keep, role, standin_a), &a, &failure) ||
      !upstream.chat_tokens(standin_body(request, keep, role, standin_b), &b, &failure))
    return {};
  a.resize(common_prefix(a, b));
  return a;
}

// The tokens before the content of a `role` message after messages[0, keep), from the
// route's prefix cache, rendered (and remembered) when it has none; null when they
// cannot be had.
std::shared_ptr<const Tokens> known_or_rendered(Route& route, const rapidjson::Document& request,
                                                size_t keep, const char* role) {
  const uint64_t key = PrefixKeys(request).key(keep, role);
  std::shared_ptr<const Tokens> tokens = route.prefixes().find(key);
  if (tokens != nullptr) return tokens;
  route.prefixes().remember(key, tokens_before_content(route.upstream(), request, keep, role));
  return route.prefixes().find(key);
}

// How far `prefix` runs in `tokens`: its length if it is a prefix, else 0.
uint32_t prefix_end(const std::vector<int32_t>& prefix, const std::vector<int32_t>& tokens) {
  return !prefix.empty() && common_prefix(prefix, tokens) == prefix.size() ? uint32_t(prefix.size())
                                                                           : 0;
}

// The conversation a request continues: the client's prompt_cache_key or "user" when
// given, else the conversation up to its first user message (siblings of one head
// differ there; later turns do not).
uint64_t session_of(const rapidjson::Document& request) {
  for (const char* key : {"prompt_cache_key", "user"})
    if (request.HasMember(key) && request[key].IsString())
      return XXH3_64bits_withSeed(request[key].GetString(), request[key].GetStringLength(), 1);
  std::string opening;
  for (const auto& m : request["messages"].GetArray()) {
    opening += to_json(m);
    if (m.IsObject() && m.HasMember("role") && m["role"].IsString() &&
        std::string(m["role"].GetString()) == "user")
      break;
  }
  return XXH3_64bits_withSeed(opening.data(), opening.size(), 2);
}

bool is_head_role(const rapidjson::Value& m) {
  if (!m.IsObject() || !m.HasMember("role") || !m["role"].IsString()) return false;
  const std::string role = m["role"].GetString();
  return role == "system" || role == "developer";
}

ReuseKind reuse_of(kvpark_reuse_kind kind) {
  switch (kind) {
    case KVPARK_REUSE_SHARED_STABLE_PREFIX: return ReuseKind::shared_stable_prefix;
    case KVPARK_REUSE_PRIVATE_TURN_CLOSURE: return ReuseKind::private_turn_closure;
    case KVPARK_REUSE_ROOT: break;
  }
  return ReuseKind::root;
}

void count_failure(Turn& turn, RestoreFailure cause) {
  ++turn.proxy->counters.restore_failures;
  ++turn.proxy->counters.failures[size_t(cause)];
}

// The plan's candidates: the head (system frontier, or a client mark on it) and
// whether the turn is parked after the response.
void plan_writes(Turn& turn, const kvpark_request* request) {
  Route& route = *turn.route;
  const auto& messages = turn.request["messages"];
  size_t leading = 0;
  while (leading < messages.Size() && is_head_role(messages[rapidjson::SizeType(leading)]))
    ++leading;
  const bool tools = kvpark_request_tools_present(request) != 0;
  const uint32_t total = uint32_t(turn.tokens.size());

  uint32_t frontier = 0;
  if ((leading > 0 || tools) && leading < messages.Size()) {
    const std::shared_ptr<const Tokens> head =
        known_or_rendered(route, turn.request, leading, "user");
    // The head's tokens must open this very prompt (a tokenizer may merge across the
    // boundary differently for another user message).
    if (head != nullptr) frontier = prefix_end(*head, turn.tokens);
  }

  std::vector<kvpark_segment> segments;
  if (frontier > 0 && frontier < total) {
    int marked = 0;
    for (size_t i = 0; i < leading; ++i) marked |= kvpark_request_message_breakpoint(request, i);
    segments.push_back(kvpark_segment{
        .kind = leading > 0 ? kvpark_request_message_kind(request, leading - 1)
                            : KVPARK_SEGMENT_TOOLS,
        .end_token = frontier,
        .explicit_breakpoint = marked});
  }
  const size_t last = messages.Size() - 1;
  segments.push_back(kvpark_segment{.kind = kvpark_request_message_kind(request, last),
                                    .end_token = total,
                                    .explicit_breakpoint =
                                        kvpark_request_message_breakpoint(request, last)});
  kvpark_write_plan_options options;
  kvpark_request_write_plan_options(request, total, !turn.proxy->options.system_candidate,
                                    &options);
  kvpark_write_candidate candidates[KVPARK_WRITE_CANDIDATES_MAX];
  size_t count = 0;
  if (kvpark_plan_write_candidates(segments.data(), segments.size(), &options, candidates,
                                   &count) == KVPARK_OK) {
    for (size_t i = 0; i < count; ++i) {
      const kvpark_write_candidate& c = candidates[i];
      const kvpark_publish_options publish{.session_id = turn.session_id,
                                           .entry_class = c.entry_class,
                                           .evidence = c.evidence};
      if (c.position_tokens == frontier && frontier > 0) {
        turn.head = frontier;
        turn.head_options = publish;
      } else if (c.position_tokens == total) {
        turn.closure = true;
        turn.closure_options = publish;
      }
    }
  }
}

// Restores `parked` into the turn's slot through its restore file. false (slot
// contents unknown) on failure.
// A refusal is believed only when slot files still round-trip through this
// upstream; otherwise the upstream is misconfigured, not the state damaged.
bool restore_into_slot(Turn& turn, const Parked& parked) {
  Route& route = *turn.route;
  // llama-server discarded a restore of this namespace: another would cost the copy
  // and save nothing (the request is prefilled, as it would be anyway).
  if (route.restores_discarded()) return false;
  const std::string name = route.slot_file_name(turn.slot, "restore");
  const std::string path = route.slot_file_path(name);
  std::string why;
  uint32_t n_restored = 0;
  bool corrupt = false;
  RestoreFailure cause = RestoreFailure::slot_file;
  route.take_spare_for_restore(turn.slot);
  const Clock::time_point started = Clock::now();
  bool ok = parked.write_slot_file(path, &why, &corrupt);
  turn.restore_file_msec = msec_since(started);
  if (corrupt) {
    cause = RestoreFailure::checksum;
    route.restore_refused();
  }
  if (ok) {
    bool refused = false;
    const Clock::time_point loading = Clock::now();
    ok = route.upstream().restore_slot(turn.slot, name, &n_restored, &why, &refused);
    turn.restore_upstream_msec = msec_since(loading);
    turn.restore_bytes = parked.file_bytes();
    if (ok) {
      route.restore_succeeded();
      route.slot_file_sizes().observe(n_restored, parked.file_bytes());
    }
    // Kept: the slot's next restore overwrites it in place (removed at exit).
    if (!ok) {
      cause = RestoreFailure::misconfigured;
      if (refused && route.recheck_with_slot(turn.slot)) {
        cause = RestoreFailure::refused;
        route.restore_refused();
      }
    }
  }
  if (!ok) {
    count_failure(turn, cause);
    std::fprintf(stderr,
                 "kvpark-proxy: upstream %s slot %u: parked state at %u tokens not restored (%s: "
                 "%s); prefilling instead\n",
                 route.name().c_str(), turn.slot, parked.position(), restore_failure_string(cause),
                 why.c_str());
    return false;
  }
  ++turn.proxy->counters.restores;
  parked.report_restored();
  turn.restored = parked.position();
  turn.reuse = reuse_of(parked.reuse_kind());
  return true;
}

// A saved slot file on its way into kvparkd: the state after tokens[0, position).
struct SavedSlot {
  std::string path;
  uint64_t file_bytes = 0;
  uint32_t position = 0;
  kvpark_publish_options options{};
  std::vector<int32_t> tokens;  // [0, position) at least
  uint32_t slot = no_slot;
};

// Has llama-server save the turn's slot as `purpose`; false (logged) on failure.
// exact: the slot must hold tokens[0, position) and nothing after them (a shared
// head: what follows it in a slot is one conversation's, never to be shared).
bool save_slot_file(Turn& turn, uint32_t position, bool exact, const char* purpose,
                    SavedSlot* ret_saved) {
  Route& route = *turn.route;
  const std::string name = route.slot_file_name(turn.slot, purpose);
  const std::string path = route.slot_file_path(name);
  std::string why;
  uint32_t n_saved = 0;
  int status = 0;
  bool ok = route.upstream().save_slot(turn.slot, name, &n_saved, &why, &status);
  if (!ok && status != 0) route.recheck_with_slot(turn.slot);  // restarted without the flag?
  if (ok && n_saved < position) {
    ok = false;
    why = "the slot holds " + std::to_string(n_saved) + " tokens, fewer than planned";
  } else if (ok && exact && n_saved != position) {
    ok = false;
    why = "the slot holds " + std::to_string(n_saved) + " tokens, more than the state alone";
  }
  struct stat st;
  if (ok && stat(path.c_str(), &st) != 0) {
    ok = false;
    why = path + ": " + std::strerror(errno);
  }
  if (!ok) {
    unlink(path.c_str());
    std::fprintf(stderr, "kvpark-proxy: upstream %s slot %u: not saved at %u tokens: %s\n",
                 route.name().c_str(), turn.slot, position, why.c_str());
    return false;
  }
  route.slot_file_sizes().observe(n_saved, uint64_t(st.st_size));
  *ret_saved = SavedSlot{.path = path,
                         .file_bytes = uint64_t(st.st_size),
                         .position = position,
                         .options = {},  // the caller's
                         .tokens = {},
                         .slot = turn.slot};
  return true;
}

// Copies a saved slot file into kvparkd (into `reserved` when the head was reserved
// before its prefill and the file has the size predicted) and removes the file.
void park_saved(ProxyState& proxy, Route& route, const SavedSlot& saved,
                Reserved* reserved = nullptr) {
  // A slot file that fails the block shape's checks fails them again: not retried.
  SlotCheck check;
  std::string why;
  if (reserved != nullptr && reserved->reserved()) {
    std::string mismatch;
    if (reserved->fill_and_seal(saved.path, &mismatch, &check)) {
      route.recycle_saved_file(saved.path);
      ++proxy.counters.publishes;
      return;
    }
    reserved->abort();  // the prediction missed: park it the ordinary way
    if (check.result != SlotImageCheck::ok) why = mismatch;
  }
  const bool ok = check.result == SlotImageCheck::ok &&
                  route.parking().park_file(saved.tokens, saved.position, saved.options,
                                            saved.path, saved.file_bytes, &why, &check);
  if (check.result == SlotImageCheck::other_layout) route.slot_layout_changed(check.space);
  if (check.result == SlotImageCheck::not_split || check.result == SlotImageCheck::other_tokens)
    ++proxy.counters.slot_files_not_split;
  route.recycle_saved_file(saved.path);
  if (ok)
    ++proxy.counters.publishes;
  else
    std::fprintf(stderr, "kvpark-proxy: upstream %s slot %u: not parked at %u tokens: %s\n",
                 route.name().c_str(), saved.slot, saved.position, why.c_str());
}

// Where the next turn's prompt starts to differ from this one: at the reply's content
// (or, for a template that renders replies unlike its generation prompt, where the
// last message ends); 0 when it cannot be found. Remembered: the next turn is
// forwarded on it.
uint32_t closure_position(Turn& turn) {
  Route& route = *turn.route;
  const size_t messages = turn.request["messages"].Size();
  const std::shared_ptr<const Tokens> closure =
      known_or_rendered(route, turn.request, messages, "assistant");
  uint32_t end = closure != nullptr ? prefix_end(*closure, turn.tokens) : 0;
  if (end == 0) {
    std::vector<int32_t> next_user;
    Reply failure;
    if (route.upstream().chat_tokens(standin_body(turn.request, messages, "user", standin_a),
                                     &next_user, &failure))
      end = uint32_t(common_prefix(next_user, turn.tokens));
  }
  return end;
}

// Whether llama-server may be trusted to trim the turn's slot back to any prefix of
// its prompt, so the slot is believed to hold the prompt. A KV cache, yes. A live
// iSWA cache keeps what trimming needs, but one loaded from a parked state holds only
// the window its last position saw (trimmed below that, under --swa-full, it answers
// wrongly). A recurrent memory can go back only to llama-server's own checkpoints,
// which fall short of where an exact parked state restores. Otherwise nothing is
// believed, and the next request restores an exact state from kvparkd.
bool slot_trimmable(const Turn& turn) {
  switch (turn.route->memory_shape()) {
    case llama::MemoryShape::kv_cache:
      return true;
    case llama::MemoryShape::sliding_window:
      return turn.restored == 0;
    case llama::MemoryShape::recurrent:
      return false;
  }
  return false;
}

// Saves the turn's slot and parks it as the state after tokens[0, position), now.
void park_slot(Turn& turn, uint32_t position, const kvpark_publish_options& options) {
  SavedSlot saved;
  if (!save_slot_file(turn, position, /*exact=*/false, "save", &saved)) return;
  saved.options = options;
  saved.tokens = turn.tokens;
  park_saved(*turn.proxy, *turn.route, saved);
}

// Saves the turn's slot, which holds exactly tokens[0, position), into a file of its
// own (the slot may save again before the copy is done) and parks it in the
// background while the request goes on: the copy into kvparkd is not the request's to
// wait for. `done` runs once it is parked, or could not be saved.
void park_exact_in_background(Turn& turn, uint32_t position, const kvpark_publish_options& options,
                              const char* kind, std::shared_ptr<Reserved> reserved,
                              std::function<void()> done) {
  static std::atomic<uint64_t> files{0};
  SavedSlot saved;
  const std::string purpose = std::string(kind) + "-" + std::to_string(++files);
  if (!save_slot_file(turn, position, /*exact=*/true, purpose.c_str(), &saved)) {
    done();
    return;
  }
  saved.options = options;
  saved.tokens.assign(turn.tokens.begin(), turn.tokens.begin() + position);
  ProxyState* proxy = turn.proxy;
  Route* route = turn.route;
  proxy->background.run([proxy, route, saved = std::move(saved), reserved, done] {
    park_saved(*proxy, *route, saved, reserved.get());
    done();
  });
}

// Parks the head the turn just prefilled; the flight ends once it is parked, so
// followers find it. Only a slot holding the head alone is parked (exact): what
// follows it in a slot is one conversation's.
void park_head_in_background(Turn& turn, std::shared_ptr<Reserved> reserved, uint64_t flight_key) {
  HeadFlights* flights = &turn.proxy->flights;
  park_exact_in_background(turn, turn.head, turn.head_options, "head", std::move(reserved),
                           [flights, flight_key] { flights->finish(flight_key); });
}

// A memory that cannot be trimmed back (sliding window, recurrent) serves a state at
// its exact length only, and after the reply the slot holds the reply too: such a
// turn's closure is parked before the reply instead. The slot is prefilled to the
// closure (at most the prompt less its last proxy_closure_tail_tokens, which the
// request then prefills), saved there and parked in the background; the request goes
// on from it, so nothing is prefilled twice. Costs the request one more round trip
// and the slot file's write before its reply.
void park_closure_before_reply(Turn& turn) {
  Route& route = *turn.route;
  if (!turn.closure || turn.slot == no_slot || route.memory_shape() == llama::MemoryShape::kv_cache)
    return;
  turn.closure = false;                    // nothing is parked after the reply
  if (route.restores_discarded()) return;  // it could not be restored
  const uint32_t end =
      std::min(closure_position(turn),
               uint32_t(turn.tokens.size()) -
                   std::min<uint32_t>(proxy_closure_tail_tokens, uint32_t(turn.tokens.size())));
  if (end <= std::max(turn.restored, turn.head)) return;
  uint32_t prefilled = 0;
  double msec = -1;
  std::string why;
  if (!route.upstream().prefill(turn.slot, turn.tokens, end, &prefilled, &msec, &why)) {
    std::fprintf(stderr, "kvpark-proxy: upstream %s slot %u: closure prefill failed: %s\n",
                 route.name().c_str(), turn.slot, why.c_str());
    return;
  }
  turn.prefilled_ahead += prefilled;
  if (msec >= 0) turn.prefill_ahead_msec = std::max(turn.prefill_ahead_msec, 0.0) + msec;
  turn.closure_ahead = true;
  park_exact_in_background(turn, end, turn.closure_options, "closure", nullptr, [] {});
}

// Whether llama-server still has what the proxy believes the slot holds: it may have
// restarted (the slot then ran no task) or someone else may have used the slot.
bool slot_still_holds(Route& route, uint32_t slot, size_t tokens) {
  std::vector<SlotReport> reports;
  if (!route.upstream().slots(&reports)) return false;  // cannot tell: restore anyway
  return slot < reports.size() && reports[slot].known && reports[slot].prompt_tokens >= tokens;
}

// The head single flight. Returns with the slot taken; the head is in it, or parked
// (then restored), or could not be had (the request prefills it).
void take_slot_with_head(Turn& turn) {
  Route& route = *turn.route;
  std::unique_ptr<Parked> parked = route.parking().lookup(turn.tokens, turn.session_id,
                                                          promotion_wait_msec, head_wait_msec_max);
  bool leading = false;
  const kvpark_hash128 space = route.namespace_id();
  const uint64_t flight_key =
      turn.head == 0 ? 0
                     : XXH3_64bits_withSeed(turn.tokens.data(), turn.head * sizeof(int32_t),
                                            space.low ^ space.high);
  HeadFlights& flights = turn.proxy->flights;
  for (int attempt = 0; turn.head > 0 && parked->position() < turn.head; ++attempt) {
    if (attempt == head_attempts_max) break;
    if (flights.lead_or_wait(flight_key, head_wait_msec_max)) {
      leading = true;
      break;
    }
    ++turn.proxy->counters.head_waits;
    parked.reset();  // give the lease back before the next lookup
    parked = route.parking().lookup(turn.tokens, turn.session_id, promotion_wait_msec,
                                    head_wait_msec_max);
  }

  size_t common = 0;
  turn.slot = route.slots().acquire(turn.tokens, &common);
  if (turn.slot == no_slot) {
    if (leading) flights.finish(flight_key);
    return;
  }
  // While the upstream is the process last checked, the beliefs stand (a restart
  // closes the witness, and check_process() then checked them with GET /slots).
  if (common > 0 && !route.same_process() && !slot_still_holds(route, turn.slot, common))
    common = 0;
  if (common > 0) turn.reuse = ReuseKind::slot;
  if (parked->position() > common && restore_into_slot(turn, *parked)) common = turn.restored;
  parked.reset();
  if (!leading) return;

  // Lead: prefill the head alone, save it, park it as shared; then the request
  // itself prefills only its delta, and the followers restore the head. Once slot
  // file sizes are known, the head is reserved in kvparkd first, so requests in
  // other processes (another proxy) see it in flight and wait too.
  auto reserved = std::make_shared<Reserved>();
  if (common < turn.head) {
    // Blocks need no prediction: their sizes are the namespace's.
    const uint64_t predicted = route.parking().parks_blocks()
                                   ? 1
                                   : route.slot_file_sizes().predict(turn.head);
    const kvpark_status s =
        predicted == 0 ? KVPARK_NOT_FOUND
                       : route.parking().reserve(turn.tokens, turn.head, turn.head_options,
                                                 predicted, reserved.get());
    if (s == KVPARK_IN_FLIGHT || s == KVPARK_ALREADY_PRESENT) {
      ++turn.proxy->counters.head_waits;  // another process leads: follow it
      std::unique_ptr<Parked> theirs = route.parking().lookup(
          turn.tokens, turn.session_id, promotion_wait_msec, head_wait_msec_max);
      if (theirs->position() >= turn.head && restore_into_slot(turn, *theirs))
        common = turn.restored;
    }
  }
  // Prefilled even into a slot believed to hold the head already: llama-server
  // reuses what it has cached and drops whatever follows the head there (another
  // conversation's turn, which this request would overwrite anyway), so the slot
  // holds the head alone when it is saved, as a shared state must (exact). The cost:
  // the tokens this request shared with that turn past the head, prefilled again.
  if (turn.restored < turn.head) {
    uint32_t prefilled = 0;
    std::string why;
    if (route.upstream().prefill(turn.slot, turn.tokens, turn.head, &prefilled,
                                 &turn.prefill_ahead_msec, &why)) {
      ++turn.proxy->counters.head_prefills;
      turn.prefilled_ahead += prefilled;
      park_head_in_background(turn, std::move(reserved), flight_key);
      return;
    }
    std::fprintf(stderr, "kvpark-proxy: upstream %s slot %u: head prefill failed: %s\n",
                 route.name().c_str(), turn.slot, why.c_str());
  }
  flights.finish(flight_key);
}

// A request that continues a prefix whose tokens the proxy knows (a head, an
// earlier turn), whose head kvparkd already holds, and for which an idle slot holds
// everything kvparkd could restore: it is forwarded at once, pinned to that slot,
// with no render or tokenize round trip before; finish_turn tokenizes it in full
// after the response, before anything is parked or believed. false (nothing taken):
// the full path.
bool take_slot_on_known_prefix(Turn& turn) {
  Route& route = *turn.route;
  const auto& messages = turn.request["messages"];
  size_t leading = 0;
  while (leading < messages.Size() && is_head_role(messages[rapidjson::SizeType(leading)]))
    ++leading;
  const PrefixKeys keys(turn.request);
  size_t keep = 0;
  const std::shared_ptr<const Tokens> known = route.prefixes().longest(keys, leading, &keep);
  if (known == nullptr) return false;
  size_t head = 0;
  if (leading > 0 || kvpark_request_tools_present(turn.parsed.get()) != 0) {
    const std::shared_ptr<const Tokens> head_tokens =
        route.prefixes().find(keys.key(leading, "user"));
    if (head_tokens == nullptr || prefix_end(*head_tokens, *known) == 0) return false;
    head = head_tokens->size();
  }
  // One token past the known prefix that no prompt holds: the lookup finds only
  // what the known tokens cover.
  Tokens probe = *known;
  probe.push_back(probe_token);
  std::unique_ptr<Parked> parked = route.parking().lookup(probe, turn.session_id, 0, 0);
  const size_t position = parked->position();
  if (position > known->size() || position < head) return false;  // the head is not parked
  size_t common = 0;
  const uint32_t slot = route.slots().try_acquire_holding(*known, position, &common);
  if (slot == no_slot) return false;
  turn.slot = slot;
  turn.known = known;
  turn.tokens = *known;
  if (common > 0) turn.reuse = ReuseKind::slot;
  return true;
}

}  // namespace

// After the response: park the turn, give the slot back, log.
void finish_turn(Turn& turn, int status, bool completed) {
  Route& route = *turn.route;
  // After the response: a changed rate is declared over a new kvparkd connection.
  if (turn.prefilled_ahead > 0)
    route.note_prefill(turn.namespace_id, turn.prefilled_ahead, turn.prefill_ahead_msec);
  if (status == 200 && completed && turn.timings_seen)
    route.note_prefill(turn.namespace_id, turn.prefilled, turn.prefill_msec);
  if (turn.known != nullptr && turn.slot != no_slot) {
    // Forwarded on a known prefix: the full tokenization now, which alone is parked
    // and believed; the known prefix must open it.
    std::vector<int32_t> full;
    Reply failure;
    const bool tokenized = status == 200 && route.upstream().chat_tokens(turn.body, &full, &failure);
    if (tokenized && prefix_end(*turn.known, full) == 0) {
      ++turn.proxy->counters.prefix_mismatches;
      std::fprintf(stderr,
                   "kvpark-proxy: upstream %s: a known prefix of %zu tokens does not open the "
                   "request's own tokenization (merged across the boundary); parked by the "
                   "full one\n",
                   route.name().c_str(), turn.known->size());
    }
    turn.tokens = tokenized ? std::move(full) : std::vector<int32_t>();
    turn.head = 0;
    turn.closure = false;
    if (tokenized) plan_writes(turn, turn.parsed.get());
  }
  if (turn.slot != no_slot) {
    if (turn.closure && status == 200 && completed && route.parking().has_namespace()) {
      const uint32_t end = closure_position(turn);
      if (end > std::max(turn.restored, turn.head)) park_slot(turn, end, turn.closure_options);
    }
    route.slots().release(turn.slot, status == 200 && slot_trimmable(turn)
                                         ? std::move(turn.tokens)
                                         : std::vector<int32_t>());
  }
  if (status == 200 && restore_discarded(turn)) {
    // Counted as what it was: a failed restore (the request was prefilled), not a reuse.
    --turn.proxy->counters.restores;
    count_failure(turn, RestoreFailure::discarded);
    if (route.restore_discarded())
      std::fprintf(stderr,
                   "kvpark-proxy: upstream %s: llama-server prefilled again the %u tokens "
                   "restored into slot %u (%s memory: it cannot continue from a state loaded "
                   "there); counted as restore_failures{cause=\"discarded\"}; no more restores "
                   "into it under this namespace%s\n",
                   route.name().c_str(), turn.restored, turn.slot,
                   llama::memory_shape_string(route.memory_shape()),
                   route.memory_shape() == llama::MemoryShape::sliding_window
                       ? " (llama-server started with --swa-full continues from a restored head)"
                       : "");
    turn.restored = 0;
    turn.reuse = ReuseKind::root;
  }
  Counters& c = turn.proxy->counters;
  const uint32_t cached = cached_tokens(turn);
  const uint32_t prefilled = turn.prefilled + turn.prefilled_ahead;
  if (status == 200) {
    ++c.answered[size_t(turn.reuse)];
    c.prompt_tokens += turn.prompt_tokens;
    c.prefilled_tokens += prefilled;
    c.restored_tokens += turn.restored;
    c.cached_tokens += cached;
    const size_t api = size_t(turn.api);
    ++c.api_answered[api];
    c.api_prompt_tokens[api] += turn.prompt_tokens;
    c.api_prefilled_tokens[api] += prefilled;
    c.api_cached_tokens[api] += cached;
  }
  std::fprintf(stderr,
               "kvpark-proxy: POST %s api=%s upstream=%s slot=%d reuse=%s cached=%u/%u "
               "prefilled=%u restored=%u ttft_ms=%.1f status=%d restore_bytes=%llu "
               "restore_file_ms=%.2f restore_upstream_ms=%.2f forward_ms=%.2f path=%s\n",
               turn.client_path.c_str(), api_string(turn.api), route.name().c_str(),
               turn.slot == no_slot ? -1 : int(turn.slot), reuse_kind_string(turn.reuse), cached,
               turn.prompt_tokens, prefilled, turn.restored, turn.ttft_msec, status,
               static_cast<unsigned long long>(turn.restore_bytes),
               turn.restore_file_msec, turn.restore_upstream_msec, turn.forward_delay_msec,
               turn.known != nullptr ? "known_prefix" : "full");
}

namespace {

// Says once per process each Messages field llama-server ignores, as a client sent it.
void note_ignored_fields(const rapidjson::Value& body) {
  static std::mutex mutex;
  static std::set<std::string> said;
  for (const std::string& name : messages_ignored_fields(body)) {
    std::lock_guard lock(mutex);
    if (!said.insert(name).second) continue;
    std::fprintf(stderr,
                 "kvpark-proxy: /v1/messages field \"%s\" is ignored, as llama-server's own "
                 "/v1/messages ignores it (said once)\n",
                 name.c_str());
  }
}

// The client's body as the Chat Completions body it renders as (turn.request), for
// Responses kept as sent too (turn.client_request: forwarded as is). false: answered
// with the client's error.
bool read_request(Turn& turn, const std::string& body, httplib::Response& res) {
  rapidjson::Document doc;
  const JsonStatus parsed_json = parse_json(body, doc);
  if (parsed_json != JsonStatus::ok) {
    send_api_error(res, turn.api, 400, "invalid_request_error",
                   "request body: " + json_error_string(parsed_json, doc));
    return false;
  }
  std::string why;
  int normalized = 0;
  bool converted = true;
  switch (turn.api) {
    case Api::chat_completions:
      turn.request.Swap(doc);
      break;
    case Api::responses:
      converted = responses_to_chat(doc, turn.request, &why);
      turn.client_request.Swap(doc);
      break;
    case Api::messages:
      note_ignored_fields(doc);
      converted = messages_to_chat(doc, turn.proxy->options.normalize_billing_header,
                                   turn.request, &normalized, &why);
      turn.proxy->counters.billing_headers_normalized += uint64_t(std::max(0, normalized));
      break;
    case Api::count:
      break;
  }
  if (!converted) {
    send_api_error(res, turn.api, 400, "invalid_request_error", why);
    return false;
  }
  const rapidjson::Document& chat = turn.request;
  if (!chat.IsObject() || !chat.HasMember("messages") || !chat["messages"].IsArray() ||
      chat["messages"].Empty()) {
    send_api_error(res, turn.api, 400, "invalid_request_error",
                   turn.api == Api::responses ? "input: expected a non-empty string or array"
                                              : "messages: expected a non-empty array of messages");
    return false;
  }
  turn.stream = chat.HasMember("stream") && chat["stream"].IsBool() && chat["stream"].GetBool();
  return true;
}

}  // namespace

void serve_cached(ProxyState& proxy, Api api, const httplib::Request& req,
                  httplib::Response& res) {
  auto turn = std::make_shared<Turn>();
  turn->start = Clock::now();
  turn->proxy = &proxy;
  turn->api = api;
  turn->client_path = req.path;
  ++proxy.counters.requests;
  ++proxy.counters.api_requests[size_t(api)];
  if (!read_request(*turn, req.body, res)) return;
  rapidjson::Document& doc = turn->request;
  // What llama-server renders: the client's body for chat, the converted one else.
  turn->body = api == Api::chat_completions ? req.body : to_json(doc);
  const std::string& chat_body = turn->body;
  kvpark_request* parsed = nullptr;
  char parse_error[256] = {};
  if (kvpark_request_parse(chat_body.data(), chat_body.size(), KVPARK_REQUEST_CHAT_COMPLETIONS,
                           &parsed, parse_error, sizeof parse_error) != KVPARK_OK) {
    send_api_error(res, api, 400, "invalid_request_error", parse_error);
    return;
  }
  turn->parsed.reset(parsed);
  const kvpark_request* request = parsed;
  const std::string model =
      doc.HasMember("model") && doc["model"].IsString() ? doc["model"].GetString() : "";
  turn->route = route_request(proxy, model);
  if (turn->route == nullptr) {
    send_api_error(res, api, 404, api == Api::messages ? "not_found_error" : "model_not_found",
                   "model '" + model + "': no upstream serves it");
    return;
  }
  Route& route = *turn->route;
  route.check_process();  // a no-op while the upstream is the process last checked
  turn->namespace_id = route.namespace_id();  // what its prefill timings measure
  if (route.ready() && route.parking().connected()) {
    turn->session_id = session_of(doc);
    if (take_slot_on_known_prefix(*turn)) {
      ++proxy.counters.forwarded_fast;
      forward(turn, res);
      return;
    }
  }
  ++proxy.counters.forwarded_full;
  Reply failure;
  if (!route.ready() || !route.upstream().chat_tokens(chat_body, &turn->tokens, &failure)) {
    if (failure.status != 0) {  // the upstream refused the request: its answer, in the
      res.status = failure.status;  // client's format
      if (api == Api::messages)
        res.set_content(messages_error_from_openai(failure.status, failure.body),
                        "application/json");
      else
        res.set_content(failure.body, failure.content_type.empty()
                                          ? "application/json"
                                          : failure.content_type.c_str());
      return;
    }
    ++proxy.counters.uncached_requests;
    turn->reuse = ReuseKind::uncached;
    forward(turn, res);  // 502 when unreachable, else served plainly
    return;
  }
  turn->session_id = session_of(doc);
  plan_writes(*turn, request);
  if (!route.parking().connected()) {
    ++proxy.counters.uncached_requests;
    turn->reuse = ReuseKind::uncached;
    std::fprintf(stderr, "kvpark-proxy: kvparkd unavailable; serving uncached\n");
    turn->head = 0;
    turn->closure = false;
  }
  take_slot_with_head(*turn);
  park_closure_before_reply(*turn);
  forward(turn, res);
}

}  // namespace kvpark::proxy
