// One request's state (chat.cpp), whichever its front door, shared with the work that
// runs after its response and with the forwarding (forward.cpp). Internal to proxy/.
#pragma once

#include <rapidjson/document.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "client/kvpark_planner.h"
#include "proxy/prompt_prefixes.h"
#include "proxy/proxy.h"
#include "proxy/wire_formats.h"

namespace kvpark::proxy {

using Clock = std::chrono::steady_clock;

// One request's state, shared with the work that runs after its response.
struct Turn {
  Turn() = default;
  Turn(const Turn&) = delete;
  Turn& operator=(const Turn&) = delete;
  ~Turn() {
    if (route != nullptr) route->end_request();
  }
  ProxyState* proxy = nullptr;
  Route* route = nullptr;  // counted in its load (route_request) until the turn ends
  kvpark_hash128 namespace_id{};  // the route's namespace when the request came
  Api api = Api::chat_completions;
  std::string client_path;        // the path the client posted to, for the log
  bool stream = false;            // the client asked for server-sent events
  // The Chat Completions body the request renders as (for chat, the client's own):
  // what is tokenized, planned and, for chat and Messages, forwarded.
  rapidjson::Document request;
  // Responses only: the client's body, forwarded to llama-server's /v1/responses.
  rapidjson::Document client_request;
  std::unique_ptr<kvpark_request, void (*)(kvpark_request*)> parsed{nullptr, kvpark_request_free};
  // The prompt's tokens: the full tokenization, or while `known` is set (forwarded on
  // a known prefix), that prefix until finish_turn tokenizes `body` in full.
  std::vector<int32_t> tokens;
  std::shared_ptr<const Tokens> known;
  std::string body;  // the Chat Completions body, as serialised: what /apply-template renders
  uint64_t session_id = 0;
  uint32_t slot = no_slot;
  uint32_t head = 0;              // the head candidate's position (0: none)
  kvpark_publish_options head_options{};
  bool closure = false;           // park the turn after the response
  bool closure_ahead = false;     // its closure was parked before the reply
  kvpark_publish_options closure_options{};
  uint32_t restored = 0;          // tokens restored from kvparkd into the slot
  ReuseKind reuse = ReuseKind::root;
  Clock::time_point start;
  double ttft_msec = -1;
  uint32_t prompt_tokens = 0;     // as the upstream reported them
  uint32_t output_tokens = 0;     // generated, as the upstream reported them
  uint32_t prefilled = 0;         // timings.prompt_n
  double prefill_msec = -1;       // timings.prompt_ms; -1: not reported
  // Prefilled before the request, on its behalf: the head it led, and for a memory
  // that cannot be trimmed back, its closure (park_closure_before_reply).
  uint32_t prefilled_ahead = 0;
  double prefill_ahead_msec = -1;  // their timings.prompt_ms, summed; -1: none
  // A restore from kvparkd: the slot file's size, the proxy's part (checking and
  // writing the file) and llama-server's (/slots/N?action=restore).
  uint64_t restore_bytes = 0;
  double restore_file_msec = 0;
  double restore_upstream_msec = 0;
  bool timings_seen = false;
  double forward_delay_msec = -1;  // arrival to forwarding: the proxy's own time
};

std::string to_json(const rapidjson::Value& v);
// The prompt tokens no prefill on the request's behalf computed: what
// usage.prompt_tokens_details.cached_tokens reports.
uint32_t cached_tokens(const Turn& turn);
double msec_since(Clock::time_point t);
// A Messages answer's prompt figures: cached_tokens as cache_read_input_tokens; of the
// prefilled tokens, those parked for later requests (a head the request led; all of
// them when its turn is parked) as cache_creation_input_tokens; the rest as input.
MessagesUsage messages_usage(const Turn& turn, uint32_t output_tokens);
// Whether llama-server prefilled again what was restored into the slot: fewer tokens
// went unprefilled than were restored (one token of slack: llama-server re-evaluates
// the last one when a prompt ends where the cache does). Known once timings are seen.
bool restore_discarded(const Turn& turn);

// After the response (or its failure): parks the turn, gives the slot back, logs
// the request's line. status: 200 for an answer; any other, none (nothing is parked
// or counted answered, and what the slot holds is forgotten). chat.cpp.
void finish_turn(Turn& turn, int status, bool completed);

// Sends the request to the turn's upstream, pinned to its slot, and relays the
// answer in the client's format; finish_turn runs once the response is written.
// forward.cpp.
void forward(std::shared_ptr<Turn> turn, httplib::Response& res);

// An error body in the client's format (Messages: Anthropic's; else OpenAI's).
void send_api_error(httplib::Response& res, Api api, int status, const std::string& type,
                    const std::string& message);

}  // namespace kvpark::proxy
