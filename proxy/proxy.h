// What the HTTP handlers share: the options, one Route per upstream, the counters.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proxy/options.h"
#include "proxy/route.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvpark::proxy {

struct ProxyState {
  ProxyOptions options;
  std::vector<std::unique_ptr<Route>> routes;
  HeadFlights flights;
  Counters counters;
};

// The route for a request's "model": of the upstreams with that name, the one with
// the fewest busy slots; with one model name configured, any name goes to it.
// nullptr: no such model.
Route* route_for_model(ProxyState& proxy, const std::string& model);

// An OpenAI-style error body: {"error": {"message", "type", "code"}}.
void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message);

// POST /v1/chat/completions (chat.cpp).
void serve_chat(ProxyState& proxy, const httplib::Request& req, httplib::Response& res);

}  // namespace kvpark::proxy
