// Forwarding a chat request to its upstream and relaying the answer: usage fixed to
// tell the truth, reuse headers, streaming event by event.
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

}  // namespace

void forward(std::shared_ptr<Turn> turn, const std::string& path, httplib::Response& res) {
  rapidjson::Document& doc = turn->request;
  rapidjson::Document body;
  body.CopyFrom(doc, body.GetAllocator());
  auto& a = body.GetAllocator();
  if (turn->slot != no_slot) {
    body.RemoveMember("id_slot");
    body.AddMember("id_slot", rapidjson::Value(turn->slot), a);
    body.RemoveMember("cache_prompt");
    body.AddMember("cache_prompt", true, a);
  }
  const bool stream = doc.HasMember("stream") && doc["stream"].IsBool() && doc["stream"].GetBool();
  std::string text_body = to_json(body);
  const Clock::time_point sent = Clock::now();
  turn->forward_delay_msec = std::chrono::duration<double, std::milli>(sent - turn->start).count();
  turn->proxy->counters.observe_forward_delay(turn->forward_delay_msec / 1000);
  auto relay = std::make_shared<Relay>(turn->route->upstream(), path, std::move(text_body));
  if (!relay->wait_status_unless(http::client_hung_up)) {
    abandon_turn(*turn, res);
    return;
  }
  std::string content_type;
  const int status = relay->wait_status(&content_type);
  if (status == 0) {
    turn->route->forget_process();  // checked again before the next request
    finish_turn(*turn, 502, false);
    send_error(res, 502, "upstream_unavailable",
               "upstream " + turn->route->name() + ": " + turn->route->upstream().describe() +
                   " is unreachable: " + relay->error());
    return;
  }
  set_reuse_headers(res, *turn);
  if (!stream || status != 200 || content_type.rfind("text/event-stream", 0) != 0) {
    if (!relay->wait_end_unless(http::client_hung_up)) {
      abandon_turn(*turn, res);
      return;
    }
    std::string text = relay->wait_body();
    if (!relay->body_complete()) {    // part of a reply is no answer: nothing is parked
      turn->route->forget_process();  // it may have died: checked again before the next request
      finish_turn(*turn, 502, false);
      send_error(res, 502, "upstream_error",
                 "upstream " + turn->route->name() + ": " + relay->failure());
      return;
    }
    // A reply the proxy cannot read (not JSON, or nested too deep) goes out as it came.
    rapidjson::Document reply;
    if (status == 200 && parse_json(text, reply) == JsonStatus::ok && fix_usage(reply, *turn)) {
      text = to_json(reply);
      if (reply.HasMember("timings") && reply["timings"].IsObject() &&
          reply["timings"].HasMember("prompt_ms") && reply["timings"]["prompt_ms"].IsNumber())
        turn->ttft_msec = std::chrono::duration<double, std::milli>(sent - turn->start).count() +
                          reply["timings"]["prompt_ms"].GetDouble();
      if (turn->timings_seen) {  // known before the body is sent: the figures in headers too
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
    }
    send_then(res, status, std::move(text),
              content_type.empty() ? "application/json" : content_type,
              [turn, status] { finish_turn(*turn, status, true); });
    return;
  }
  auto splitter = std::make_shared<EventSplitter>([turn](std::string event) {
    if (turn->ttft_msec < 0) turn->ttft_msec = msec_since(turn->start);
    if (event.rfind("data: {", 0) != 0 || (event.find("\"usage\"") == std::string::npos &&
                                             event.find("\"timings\"") == std::string::npos))
      return event;
    rapidjson::Document chunk;
    const size_t json_end = event.find_last_not_of('\n') + 1;
    const std::string_view json = std::string_view(event).substr(6, json_end - 6);
    if (parse_json(json, chunk) != JsonStatus::ok || !fix_usage(chunk, *turn)) return event;
    return "data: " + to_json(chunk) + "\n\n";
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
