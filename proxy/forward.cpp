// Forwarding a request to its upstream and relaying the answer in the client's format
// (chat and Responses as llama-server writes them, Messages converted from chat):
// usage fixed to tell the truth, reuse headers, streaming event by event.
#include <httplib.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cstdio>
#include <string_view>

#include "http/listener.h"
#include "proxy/json.h"
#include "proxy/relay.h"
#include "proxy/turn.h"

namespace kvpark::proxy {

std::string to_json(const rapidjson::Value& v) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  v.Accept(w);
  return std::string(buffer.GetString(), buffer.GetSize());
}

double msec_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

uint32_t cached_tokens(const Turn& turn) {
  const uint64_t computed = uint64_t(turn.prefilled) + turn.prefilled_ahead;
  return turn.prompt_tokens > computed ? uint32_t(turn.prompt_tokens - computed) : 0;
}

MessagesUsage messages_usage(const Turn& turn, uint32_t output_tokens) {
  const uint32_t cached = std::min(cached_tokens(turn), turn.prompt_tokens);
  const uint32_t prefilled = turn.prompt_tokens - cached;
  // A turn forwarded on a known prefix is planned after its answer; its closure is
  // parked then unless the client marked something else (explicit mode).
  const bool turn_parked = turn.reuse != ReuseKind::uncached &&
                           (turn.closure || turn.closure_ahead || turn.known != nullptr);
  const uint32_t created = turn_parked ? prefilled : std::min(prefilled, turn.prefilled_ahead);
  return MessagesUsage{.input_tokens = prefilled - created,
                       .cache_read_input_tokens = cached,
                       .cache_creation_input_tokens = created,
                       .output_tokens = output_tokens};
}

void send_api_error(httplib::Response& res, Api api, int status, const std::string& type,
                    const std::string& message) {
  if (api != Api::messages) return send_error(res, status, type, message);
  res.status = status;
  res.set_content(messages_error_body(messages_error_type(status), message), "application/json");
}

bool restore_discarded(const Turn& turn) {
  return turn.timings_seen && turn.restored > 0 &&
         uint64_t(cached_tokens(turn)) + 1 < turn.restored;
}

namespace {

// Rewrites usage.prompt_tokens_details.cached_tokens to what no prefill on the
// request's behalf computed (llama-server's figure counts a head this request led,
// prefilled just before, as cached), and notes the figures for the log. Returns false when `doc` carries no usage.
bool fix_usage(rapidjson::Document& doc, Turn& turn) {
  if (!doc.IsObject()) return false;
  if (doc.HasMember("timings") && doc["timings"].IsObject()) {
    const auto& t = doc["timings"];
    if (t.HasMember("prompt_n") && t["prompt_n"].IsInt()) {
      turn.prefilled = uint32_t(std::max(0, t["prompt_n"].GetInt()));
      turn.timings_seen = true;
    }
    if (t.HasMember("prompt_ms") && t["prompt_ms"].IsNumber())
      turn.prefill_msec = t["prompt_ms"].GetDouble();
  }
  if (!doc.HasMember("usage") || !doc["usage"].IsObject()) return false;
  auto& usage = doc["usage"];
  if (usage.HasMember("prompt_tokens") && usage["prompt_tokens"].IsUint())
    turn.prompt_tokens = usage["prompt_tokens"].GetUint();
  if (usage.HasMember("completion_tokens") && usage["completion_tokens"].IsUint())
    turn.output_tokens = usage["completion_tokens"].GetUint();
  if (!turn.timings_seen) return true;
  const uint32_t cached = cached_tokens(turn);
  auto& a = doc.GetAllocator();
  if (!usage.HasMember("prompt_tokens_details") || !usage["prompt_tokens_details"].IsObject())
    usage.AddMember("prompt_tokens_details", rapidjson::Value(rapidjson::kObjectType), a);
  auto& details = usage["prompt_tokens_details"];
  if (details.HasMember("cached_tokens"))
    details["cached_tokens"].SetUint(cached);
  else
    details.AddMember("cached_tokens", rapidjson::Value(cached), a);
  return true;
}

void set_reuse_headers(httplib::Response& res, const Turn& turn) {
  res.set_header("X-Kvpark-Reuse", reuse_kind_string(turn.reuse));
  res.set_header("X-Kvpark-Restored-Tokens", std::to_string(turn.restored));
  if (turn.slot != no_slot) res.set_header("X-Kvpark-Slot", std::to_string(turn.slot));
  char delay[32];
  std::snprintf(delay, sizeof delay, "%.3f", turn.forward_delay_msec);
  res.set_header("X-Kvpark-Forward-Ms", delay);  // the proxy's time before forwarding
  res.set_header("X-Kvpark-Forward-Path", turn.known != nullptr ? "known_prefix" : "full");
}

// The client hung up before its answer began: the upstream's request is abandoned
// (llama-server cancels the generation once its connection closes), and the turn
// ends as nginx logs such a request, 499, with nothing parked or counted answered.
void abandon_turn(Turn& turn, httplib::Response& res) {
  ++turn.proxy->counters.abandoned;
  finish_turn(turn, client_closed_request, false);
  res.status = client_closed_request;  // written to no one
}

// Records the prompt figures of a Responses object (the answer, or a streamed
// response.completed event's "response"; `timings` beside it when llama-server gave
// them) and rewrites its cached_tokens. Without timings, what llama-server prefilled
// is its input less what it found cached (its prompt_n and cache_n add up so).
bool fix_responses_usage(rapidjson::Value& response, const rapidjson::Value* timings, Turn& turn,
                         rapidjson::Document::AllocatorType& allocator) {
  uint32_t input = 0, cached_upstream = 0;
  if (!responses_usage(response, &input, &cached_upstream)) return false;
  turn.prompt_tokens = input;
  if (timings != nullptr && timings->IsObject() && timings->HasMember("prompt_n") &&
      (*timings)["prompt_n"].IsInt()) {
    turn.prefilled = uint32_t(std::max(0, (*timings)["prompt_n"].GetInt()));
    if (timings->HasMember("prompt_ms") && (*timings)["prompt_ms"].IsNumber())
      turn.prefill_msec = (*timings)["prompt_ms"].GetDouble();
  } else {
    turn.prefilled = input - std::min(input, cached_upstream);
  }
  turn.timings_seen = true;
  if (response.HasMember("usage") && response["usage"].IsObject() &&
      response["usage"].HasMember("output_tokens") && response["usage"]["output_tokens"].IsUint())
    turn.output_tokens = response["usage"]["output_tokens"].GetUint();
  set_responses_cached_tokens(response, cached_tokens(turn), allocator);
  return true;
}

// The upstream endpoint: Responses go to llama-server's own (it keeps id_slot);
// Messages go as the chat body they became (llama-server's Messages converter drops
// id_slot, so a pinned request could land in another slot).
std::string upstream_path(const Turn& turn) {
  switch (turn.api) {
    case Api::responses: return "/v1/responses";
    case Api::messages: return "/v1/chat/completions";
    default: return turn.client_path;
  }
}

std::string upstream_body(const Turn& turn) {
  rapidjson::Document body;
  body.CopyFrom(turn.api == Api::responses ? turn.client_request : turn.request,
                body.GetAllocator());
  auto& a = body.GetAllocator();
  if (turn.slot != no_slot) {
    body.RemoveMember("id_slot");
    body.AddMember("id_slot", rapidjson::Value(turn.slot), a);
    body.RemoveMember("cache_prompt");
    body.AddMember("cache_prompt", true, a);
  }
  if (turn.api == Api::messages && turn.stream) {  // the usage chunk: the prompt's figures
    body.RemoveMember("stream_options");
    rapidjson::Value options(rapidjson::kObjectType);
    options.AddMember("include_usage", true, a);
    body.AddMember("stream_options", options, a);
  }
  return to_json(body);
}

// A whole answer (status 200) with usage told truthfully, in the client's format;
// `text` unchanged when the proxy cannot read it. TTFT from timings where given.
std::string rewrite_answer(Turn& turn, std::string text, Clock::time_point sent) {
  rapidjson::Document reply;
  if (parse_json(text, reply) != JsonStatus::ok || !reply.IsObject()) return text;
  if (turn.api == Api::responses) {
    return fix_responses_usage(reply, nullptr, turn, reply.GetAllocator()) ? to_json(reply)
                                                                            : text;
  }
  if (!fix_usage(reply, turn)) return text;
  if (reply.HasMember("timings") && reply["timings"].IsObject() &&
      reply["timings"].HasMember("prompt_ms") && reply["timings"]["prompt_ms"].IsNumber())
    turn.ttft_msec = std::chrono::duration<double, std::milli>(sent - turn.start).count() +
                     reply["timings"]["prompt_ms"].GetDouble();
  if (turn.api == Api::chat_completions) return to_json(reply);
  std::string message;
  return chat_answer_to_message(reply, messages_usage(turn, turn.output_tokens), &message)
             ? message
             : text;
}

// The data line of a server-sent event ("event: NAME\ndata: JSON\n\n" or "data: ..."):
// where its JSON starts and ends; false when it has none.
bool event_data(const std::string& event, size_t* ret_begin, size_t* ret_end) {
  size_t at = event.rfind("data: ", 0) == 0 ? 0 : event.find("\ndata: ");
  if (at == std::string::npos) return false;
  if (at != 0) ++at;
  *ret_begin = at + 6;
  const size_t line_end = event.find('\n', *ret_begin);
  *ret_end = line_end == std::string::npos ? event.size() : line_end;
  return true;
}

// What a relayed stream keeps from one event to the next.
struct StreamState {
  MessagesStream messages;
  ResponsesStream responses;
};

// One streamed event rewritten for the client. Chat: usage fixed where it comes.
// Responses: each event completed for the SDKs, response.completed's usage fixed.
// Messages: each chat chunk becomes its Messages events; [DONE] closes the message
// with the prompt's figures.
std::string rewrite_event(Turn& turn, StreamState& state, std::string event) {
  if (turn.ttft_msec < 0) turn.ttft_msec = msec_since(turn.start);
  size_t begin = 0, end = 0;
  if (!event_data(event, &begin, &end)) return turn.api == Api::messages ? "" : event;
  const std::string_view data = std::string_view(event).substr(begin, end - begin);
  if (turn.api == Api::messages && data == "[DONE]")
    return state.messages.finish(messages_usage(turn, turn.output_tokens));
  const bool chat_usage = data.find("\"usage\"") != std::string_view::npos ||
                          data.find("\"timings\"") != std::string_view::npos;
  rapidjson::Document chunk;
  if ((turn.api == Api::chat_completions && !chat_usage) ||
      parse_json(data, chunk) != JsonStatus::ok || !chunk.IsObject())
    return turn.api == Api::messages ? "" : event;
  std::string after;  // events to send after this one
  switch (turn.api) {
    case Api::messages:
      fix_usage(chunk, turn);
      return state.messages.on_chunk(chunk);
    case Api::responses:
      after = state.responses.complete(chunk);
      if (chunk.HasMember("response") && chunk.HasMember("type") &&
          chunk["type"] == "response.completed")
        fix_responses_usage(chunk["response"],
                            chunk.HasMember("timings") ? &chunk["timings"] : nullptr, turn,
                            chunk.GetAllocator());
      break;
    default:
      if (!fix_usage(chunk, turn)) return event;
      break;
  }
  return event.substr(0, begin) + to_json(chunk) + "\n\n" + after;
}

}  // namespace

void forward(std::shared_ptr<Turn> turn, httplib::Response& res) {
  std::string text_body = upstream_body(*turn);
  const Clock::time_point sent = Clock::now();
  turn->forward_delay_msec = std::chrono::duration<double, std::milli>(sent - turn->start).count();
  turn->proxy->counters.observe_forward_delay(turn->forward_delay_msec / 1000);
  auto relay =
      std::make_shared<Relay>(turn->route->upstream(), upstream_path(*turn), std::move(text_body));
  if (!relay->wait_status_unless(http::client_hung_up)) {
    abandon_turn(*turn, res);
    return;
  }
  std::string content_type;
  const int status = relay->wait_status(&content_type);
  if (status == 0) {
    turn->route->forget_process();  // checked again before the next request
    finish_turn(*turn, 502, false);
    send_api_error(res, turn->api, 502, "upstream_unavailable",
                   "upstream " + turn->route->name() + ": " +
                       turn->route->upstream().describe() + " is unreachable: " + relay->error());
    return;
  }
  set_reuse_headers(res, *turn);
  if (!turn->stream || status != 200 || content_type.rfind("text/event-stream", 0) != 0) {
    if (!relay->wait_end_unless(http::client_hung_up)) {
      abandon_turn(*turn, res);
      return;
    }
    std::string text = relay->wait_body();
    if (!relay->body_complete()) {    // part of a reply is no answer: nothing is parked
      turn->route->forget_process();  // it may have died: checked again before the next request
      finish_turn(*turn, 502, false);
      send_api_error(res, turn->api, 502, "upstream_error",
                     "upstream " + turn->route->name() + ": " + relay->failure());
      return;
    }
    if (status == 200) {
      text = rewrite_answer(*turn, std::move(text), sent);
    } else if (turn->api == Api::messages) {  // llama-server's chat error, in Anthropic's shape
      text = messages_error_from_openai(status, text);
      content_type = "application/json";
    }
    if (status == 200 && turn->timings_seen) {  // known before the body is sent: in headers too
      if (restore_discarded(*turn)) {  // restored into the slot, but saved nothing
        res.headers.erase("X-Kvpark-Restored-Tokens");
        res.set_header("X-Kvpark-Restored-Tokens", "0");
        res.headers.erase("X-Kvpark-Reuse");
        res.set_header("X-Kvpark-Reuse", reuse_kind_string(ReuseKind::root));
      }
      res.set_header("X-Kvpark-Prefilled-Tokens",
                     std::to_string(turn->prefilled + turn->prefilled_ahead));
      res.set_header("X-Kvpark-Cached-Tokens", std::to_string(cached_tokens(*turn)));
    }
    send_then(res, status, std::move(text),
              content_type.empty() ? "application/json" : content_type,
              [turn, status] { finish_turn(*turn, status, true); });
    return;
  }
  auto state = std::make_shared<StreamState>();
  auto splitter = std::make_shared<EventSplitter>([turn, state](std::string event) {
    return rewrite_event(*turn, *state, std::move(event));
  });
  stream_to_client(
      relay, res, content_type,
      [splitter](const std::string& chunk, bool last) {
        return last ? splitter->flush() : splitter->feed(chunk);
      },
      [turn](StreamEnd end) {
        if (end == StreamEnd::client_gone) ++turn->proxy->counters.abandoned;
        if (end != StreamEnd::upstream_failed) {
          finish_turn(*turn, 200, end == StreamEnd::completed);
          return;
        }
        // The client had status 200, but no answer: finished (logged) as the 502 it is.
        turn->route->forget_process();
        finish_turn(*turn, 502, false);
      });
}

}  // namespace kvpark::proxy
