// The HTTP front: routes, pass-through of every other endpoint, health and status.
#include "proxy/front.h"

#include <httplib.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <thread>

#include "http/listener.h"
#include "proxy/json.h"
#include "proxy/relay.h"

namespace kvpark::proxy {
namespace {

constexpr size_t server_threads = 64;  // concurrent requests (followers wait on a thread)

// The body's "model"; "" when it names none, or is not JSON the proxy reads (too
// deep included: such a body is passed through unread, for the upstream to judge).
std::string model_of(const httplib::Request& req) {
  rapidjson::Document doc;
  if (parse_json(req.body, doc) != JsonStatus::ok || !doc.IsObject() || !doc.HasMember("model") ||
      !doc["model"].IsString())
    return "";
  return doc["model"].GetString();
}

std::string target_of(const httplib::Request& req) {
  if (req.params.empty()) return req.path;
  return req.path + "?" + httplib::detail::params_to_query_str(req.params);
}

// Any endpoint the proxy does not handle goes to the upstream the body's model
// names (the first upstream otherwise), streamed back as it arrives.
void pass_through(ProxyState& proxy, const httplib::Request& req, httplib::Response& res) {
  Route* route = route_for_model(proxy, model_of(req));
  if (route == nullptr) route = proxy.routes.front().get();
  if (req.method == "GET" || req.method == "HEAD" || req.method == "DELETE") {
    httplib::Client client(route->upstream().options().url);
    httplib::Result result = req.method == "GET"    ? client.Get(target_of(req).c_str())
                             : req.method == "HEAD" ? client.Head(target_of(req).c_str())
                                                    : client.Delete(target_of(req).c_str());
    if (!result) {
      send_error(res, 502, "upstream_unavailable",
                 "upstream " + route->name() + ": " + route->upstream().describe() +
                     " is unreachable: " + describe_http_error(int(result.error())));
      return;
    }
    res.status = result->status;
    const std::string type = result->get_header_value("Content-Type");
    res.set_content(result->body, type.empty() ? "application/octet-stream" : type.c_str());
    return;
  }
  auto relay = std::make_shared<Relay>(route->upstream(), target_of(req), req.body);
  // A client gone before its answer: the upstream's work for it is abandoned.
  const auto abandoned = [&proxy, &res] {
    ++proxy.counters.abandoned;
    res.status = client_closed_request;  // written to no one
  };
  if (!relay->wait_status_unless(http::client_hung_up)) return abandoned();
  std::string content_type;
  const int status = relay->wait_status(&content_type);
  if (status == 0) {
    send_error(res, 502, "upstream_unavailable",
               "upstream " + route->name() + ": " + route->upstream().describe() +
                   " is unreachable: " + relay->error());
    return;
  }
  if (status == 200 && content_type.rfind("text/event-stream", 0) == 0) {
    stream_to_client(
        relay, res, content_type, [](const std::string& chunk, bool) { return chunk; },
        [&proxy](StreamEnd end) {
          if (end == StreamEnd::client_gone) ++proxy.counters.abandoned;
        });
    return;
  }
  if (!relay->wait_end_unless(http::client_hung_up)) return abandoned();
  std::string body = relay->wait_body();
  if (!relay->body_complete()) {
    send_error(res, 502, "upstream_error", "upstream " + route->name() + ": " + relay->failure());
    return;
  }
  res.status = status;
  res.set_content(std::move(body),
                  content_type.empty() ? "application/octet-stream" : content_type.c_str());
}

// Every configured model name once, as clients send it in "model".
void serve_models(ProxyState& proxy, httplib::Response& res) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("object");
  w.String("list");
  w.Key("data");
  w.StartArray();
  std::vector<std::string> names;
  for (const auto& route : proxy.routes) {
    if (std::find(names.begin(), names.end(), route->name()) != names.end()) continue;
    names.push_back(route->name());
    w.StartObject();
    w.Key("id");
    w.String(route->name().c_str());
    w.Key("object");
    w.String("model");
    w.Key("created");
    w.Uint(0);
    w.Key("owned_by");
    w.String("kvpark-proxy");
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  res.set_content(buffer.GetString(), "application/json");
}

void serve_status(ProxyState& proxy, httplib::Response& res) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  bool connected = false;
  for (const auto& route : proxy.routes) connected = connected || route->parking().connected();
  const Counters& c = proxy.counters;
  w.StartObject();
  w.Key("kvparkd_connected");
  w.Bool(connected);
  const std::pair<const char*, const std::atomic<uint64_t>*> counters[] = {
      {"requests", &c.requests},           {"uncached_requests", &c.uncached_requests},
      {"head_prefills", &c.head_prefills}, {"head_waits", &c.head_waits},
      {"restores", &c.restores},           {"restore_failures", &c.restore_failures},
      {"publishes", &c.publishes},         {"abandoned", &c.abandoned},
      {"slot_files_not_split", &c.slot_files_not_split}};
  for (const auto& [name, value] : counters) {
    w.Key(name);
    w.Uint64(value->load());
  }
  w.Key("billing_headers_normalized");
  w.Uint64(c.billing_headers_normalized.load());
  w.Key("apis");  // by front door: requests received, answered, their prompt figures
  w.StartObject();
  for (size_t api = 0; api < size_t(Api::count); ++api) {
    w.Key(api_string(Api(api)));
    w.StartObject();
    const std::pair<const char*, const std::atomic<uint64_t>*> figures[] = {
        {"requests", &c.api_requests[api]},
        {"answered", &c.api_answered[api]},
        {"prompt_tokens", &c.api_prompt_tokens[api]},
        {"prefilled_tokens", &c.api_prefilled_tokens[api]},
        {"cached_tokens", &c.api_cached_tokens[api]}};
    for (const auto& [name, value] : figures) {
      w.Key(name);
      w.Uint64(value->load());
    }
    w.EndObject();
  }
  w.EndObject();
  w.Key("upstreams");
  w.StartArray();
  for (const auto& route : proxy.routes) {
    w.StartObject();
    w.Key("name");
    w.String(route->name().c_str());
    w.Key("url");
    w.String(route->upstream().options().url.c_str());
    w.Key("ready");
    w.Bool(route->ready());
    w.Key("state");
    w.String(upstream_state_string(route->state()));
    w.Key("reason");
    w.String(route->state_reason().c_str());
    w.Key("load");
    w.Uint(route->load());
    w.Key("slots");
    w.Uint(route->slots().size());
    w.Key("busy_slots");
    w.Uint(route->slots().busy());
    w.Key("namespace");
    w.String(route->namespace_hex().c_str());
    w.Key("parking");  // "blocks", or "whole: <why>" (state_blocks.h)
    w.String(route->parking_mode().c_str());
    {
      const std::shared_ptr<const BlockShape> shape = route->block_shape();
      w.Key("block_tokens");  // 0: whole slot files
      w.Uint(shape != nullptr ? shape->block_tokens : 0);
      w.Key("block_bytes");
      w.Uint64(shape != nullptr ? shape->block_bytes : 0);
    }
    w.Key("memory");  // what the model's memory keeps: kv_cache, sliding_window, recurrent
    w.String(llama::memory_shape_string(route->memory_shape()));
    w.Key("restores_discarded");  // llama-server discarded a restore: restores are off
    w.Bool(route->restores_discarded());
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  res.set_content(buffer.GetString(), "application/json");
}

// GET /health: 200 when every upstream is ready; 503 with what is not, as
// llama-server answers while it loads.
void serve_health(ProxyState& proxy, httplib::Response& res) {
  std::string reasons;
  for (const auto& route : proxy.routes) {
    if (route->ready()) continue;
    if (!reasons.empty()) reasons += "; ";
    reasons += "upstream " + route->name() + " " + upstream_state_string(route->state()) + ": " +
               route->state_reason();
  }
  if (reasons.empty()) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
    return;
  }
  send_error(res, 503, "unavailable_error", reasons);
}

}  // namespace

Route* route_for_model(ProxyState& proxy, const std::string& model) {
  bool one_name = true;
  for (const auto& route : proxy.routes) one_name = one_name && route->name() == proxy.routes[0]->name();
  Route* best = nullptr;
  for (const auto& route : proxy.routes) {
    if (route->name() != model && !one_name) continue;
    const bool better =
        best == nullptr || (route->ready() && !best->ready()) ||
        (route->ready() == best->ready() && route->load() < best->load());
    if (better) best = route.get();
  }
  return best;
}

void Background::run(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    ++running_;
  }
  std::thread([this, work = std::move(work)] {
    work();
    std::lock_guard lock(mutex_);
    --running_;
    idle_.notify_all();
  }).detach();
}

void Background::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return running_ == 0; });
}

Route* route_request(ProxyState& proxy, const std::string& model) {
  std::lock_guard lock(proxy.routing_mutex);
  Route* route = route_for_model(proxy, model);
  if (route != nullptr) route->begin_request();
  return route;
}

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message) {
  res.status = status;
  res.set_content(error_body(status, type, message), "application/json");
}

void install_routes(ProxyState& proxy, httplib::Server& server) {
  server.new_task_queue = [] { return new httplib::ThreadPool(server_threads); };
  // Three front doors, one request flow (chat.cpp); each also without "/v1", as
  // llama-server serves them.
  const std::pair<const char*, Api> doors[] = {
      {"/v1/chat/completions", Api::chat_completions}, {"/chat/completions", Api::chat_completions},
      {"/v1/responses", Api::responses},               {"/responses", Api::responses},
      {"/v1/messages", Api::messages},                 {"/messages", Api::messages}};
  for (const auto& [path, api] : doors) {
    server.Post(path, [&proxy, api = api](const httplib::Request& req, httplib::Response& res) {
      serve_cached(proxy, api, req, res);
    });
  }
  server.Get("/health", [&proxy](const httplib::Request&, httplib::Response& res) {
    serve_health(proxy, res);
  });
  server.Get("/metrics", [&proxy](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(proxy), "text/plain; version=0.0.4");
  });
  server.Get("/kvpark/status", [&proxy](const httplib::Request&, httplib::Response& res) {
    serve_status(proxy, res);
  });
  server.Get("/v1/models", [&proxy](const httplib::Request&, httplib::Response& res) {
    serve_models(proxy, res);
  });
  auto other = [&proxy](const httplib::Request& req, httplib::Response& res) {
    pass_through(proxy, req, res);
  };
  server.Get(".*", other);
  server.Post(".*", other);
  server.Put(".*", other);
  server.Delete(".*", other);
}

}  // namespace kvpark::proxy
