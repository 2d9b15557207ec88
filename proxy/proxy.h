// What the HTTP handlers share: the options, one Route per upstream, the counters.
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/options.h"
#include "proxy/route.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvpark::proxy {

// Work that runs after the request that caused it went on (parking a head): each
// on a thread of its own; wait_idle() at exit.
class Background {
 public:
  void run(std::function<void()> work);
  void wait_idle();

 private:
  std::mutex mutex_;
  std::condition_variable idle_;
  size_t running_ = 0;
};

struct ProxyState {
  ProxyOptions options;
  std::vector<std::unique_ptr<Route>> routes;
  HeadFlights flights;
  Counters counters;
  std::mutex routing_mutex;  // a choice and its load count are one step
  Background background;
};

// The route for a request's "model": of the upstreams with that name, a ready one
// before others, then the one with the least load (requests in progress there,
// waiting ones included); with one model name configured, any name goes to it.
// nullptr: no such model.
Route* route_for_model(ProxyState& proxy, const std::string& model);
// route_for_model, counted in the route's load (the caller calls end_request()).
Route* route_request(ProxyState& proxy, const std::string& model);

// An OpenAI-style error body: {"error": {"message", "type", "code"}}.
void send_error(httplib::Response& res, int status, const std::string& type,
                const std::string& message);

// GET /metrics: Prometheus text (metrics.cpp).
std::string metrics_text(ProxyState& proxy);

// POST /v1/chat/completions, /v1/responses, /v1/messages: parked and restored, the
// answer in the client's format (chat.cpp).
void serve_cached(ProxyState& proxy, Api api, const httplib::Request& req,
                  httplib::Response& res);

}  // namespace kvpark::proxy
