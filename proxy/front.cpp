// The HTTP front: routes, pass-through of every other endpoint, health and status.
#include "proxy/front.h"

#include <httplib.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>

#include "proxy/relay.h"

namespace kvpark::proxy {
namespace {

constexpr size_t server_threads = 64;  // concurrent requests (followers wait on a thread)

std::string model_of(const httplib::Request& req) {
  rapidjson::Document doc;
  doc.Parse(req.body.c_str(), req.body.size());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("model") || !doc["model"].IsString())
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
                 "upstream " + route->name() + " is unreachable: " + httplib::to_string(result.error()));
      return;
    }
    res.status = result->status;
    const std::string type = result->get_header_value("Content-Type");
    res.set_content(result->body, type.empty() ? "application/octet-stream" : type.c_str());
    return;
  }
  auto relay = std::make_shared<Relay>(route->upstream(), target_of(req), req.body);
  std::string content_type;
  const int status = relay->wait_status(&content_type);
  if (status == 0) {
    send_error(res, 502, "upstream_unavailable",
               "upstream " + route->name() + " is unreachable: " + relay->error());
    return;
  }
  if (status == 200 && content_type.rfind("text/event-stream", 0) == 0) {
    stream_to_client(
        relay, res, content_type, [](const std::string& chunk, bool) { return chunk; },
        [](bool) {});
    return;
  }
  res.status = status;
  res.set_content(relay->wait_body(),
                  content_type.empty() ? "application/octet-stream" : content_type.c_str());
}

void serve_models(ProxyState& proxy, const httplib::Request& req, httplib::Response& res) {
  if (proxy.routes.size() == 1) return pass_through(proxy, req, res);
  // Several upstreams: one list, each model under the name it routes by.
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
      {"publishes", &c.publishes}};
  for (const auto& [name, value] : counters) {
    w.Key(name);
    w.Uint64(value->load());
  }
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
    w.Key("slots");
    w.Uint(route->slots().size());
    w.Key("busy_slots");
    w.Uint(route->slots().busy());
    w.Key("namespace");
    w.String(route->ready() ? route->namespace_hex().c_str() : "");
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  res.set_content(buffer.GetString(), "application/json");
}

}  // namespace

Route* route_for_model(ProxyState& proxy, const std::string& model) {
  bool one_name = true;
  for (const auto& route : proxy.routes) one_name = one_name && route->name() == proxy.routes[0]->name();
  Route* best = nullptr;
  uint32_t best_busy = 0;
  for (const auto& route : proxy.routes) {
    if (route->name() != model && !one_name) continue;
    const uint32_t busy = route->slots().busy();
    if (best == nullptr || busy < best_busy) {
      best = route.get();
      best_busy = busy;
    }
  }
  return best;
}

void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  w.StartObject();
  w.Key("error");
  w.StartObject();
  w.Key("message");
  w.String(message.c_str(), rapidjson::SizeType(message.size()));
  w.Key("type");
  w.String(type.c_str());
  w.Key("code");
  w.Int(status);
  w.EndObject();
  w.EndObject();
  res.status = status;
  res.set_content(buffer.GetString(), "application/json");
}

void install_routes(ProxyState& proxy, httplib::Server& server) {
  server.new_task_queue = [] { return new httplib::ThreadPool(server_threads); };
  auto chat = [&proxy](const httplib::Request& req, httplib::Response& res) {
    serve_chat(proxy, req, res);
  };
  server.Post("/v1/chat/completions", chat);
  server.Post("/chat/completions", chat);
  server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  server.Get("/kvpark/status", [&proxy](const httplib::Request&, httplib::Response& res) {
    serve_status(proxy, res);
  });
  server.Get("/v1/models", [&proxy](const httplib::Request& req, httplib::Response& res) {
    serve_models(proxy, req, res);
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
