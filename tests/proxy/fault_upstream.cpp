#include "tests/proxy/fault_upstream.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace kvpark::testing {
namespace {

constexpr time_t relay_timeout_sec = 600;  // a long prefill on a shared core

std::string target_of(const httplib::Request& req) {
  if (req.params.empty()) return req.path;
  return req.path + "?" + httplib::detail::params_to_query_str(req.params);
}

// Sends `body`'s first half with `status` and `content_type`, then closes: chunked
// for an event stream (as llama-server streams), with the whole Content-Length
// otherwise; either way the reader sees the body end early.
void send_half(httplib::Response& res, int status, std::string body,
               const std::string& content_type) {
  res.status = status;
  auto shared = std::make_shared<std::string>(std::move(body));
  const size_t half = shared->size() / 2;
  if (content_type.rfind("text/event-stream", 0) == 0) {
    res.set_chunked_content_provider(content_type,
                                     [shared, half](size_t offset, httplib::DataSink& sink) {
                                       if (offset >= half) return false;  // closes, no last chunk
                                       return sink.write(shared->data(), half);
                                     });
    return;
  }
  res.set_content_provider(shared->size(), content_type,
                           [shared, half](size_t offset, size_t length, httplib::DataSink& sink) {
                             if (offset >= half) return false;  // closes short of Content-Length
                             return sink.write(shared->data() + offset,
                                               std::min(length, half - offset));
                           });
}

}  // namespace

FaultUpstream::FaultUpstream(std::string llama_server_url) : target_(std::move(llama_server_url)) {
  auto relay = [this](const httplib::Request& req, httplib::Response& res) {
    this->relay(req, res);
  };
  server_.Get(".*", relay);
  server_.Post(".*", relay);
}

FaultUpstream::~FaultUpstream() {
  release();
  server_.stop();
  if (thread_.joinable()) thread_.join();
}

bool FaultUpstream::start() {
  port_ = server_.bind_to_any_port("127.0.0.1");
  if (port_ <= 0) return false;
  thread_ = std::thread([this] { server_.listen_after_bind(); });
  return true;
}

std::string FaultUpstream::url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

void FaultUpstream::arm(const std::string& path, UpstreamFault fault) {
  std::lock_guard lock(mutex_);
  armed_[path] = fault;
}

void FaultUpstream::release() {
  std::lock_guard lock(mutex_);
  released_ = true;
  released_changed_.notify_all();
}

UpstreamFault FaultUpstream::take_fault(const std::string& path) {
  std::lock_guard lock(mutex_);
  auto it = armed_.find(path);
  if (it == armed_.end()) return UpstreamFault::none;
  const UpstreamFault fault = it->second;
  armed_.erase(it);
  return fault;
}

std::string FaultUpstream::last_body(const std::string& path) {
  std::lock_guard lock(mutex_);
  const auto it = last_bodies_.find(path);
  return it == last_bodies_.end() ? "" : it->second;
}

void FaultUpstream::relay(const httplib::Request& req, httplib::Response& res) {
  {
    std::lock_guard lock(mutex_);
    last_bodies_[req.path] = req.body;
  }
  const UpstreamFault fault = take_fault(req.path);
  if (fault == UpstreamFault::deep_ok || fault == UpstreamFault::deep_error) {
    ++delivered_;
    const std::string deep(deep_fault_levels, '[');
    res.status = fault == UpstreamFault::deep_ok ? 200 : 500;
    if (req.body.find("\"stream\":true") != std::string::npos)
      res.set_content("data: {\"usage\":" + deep + "\n\ndata: [DONE]\n\n", "text/event-stream");
    else
      res.set_content(deep, "application/json");
    return;
  }
  if (fault == UpstreamFault::hold) {
    ++delivered_;
    std::unique_lock lock(mutex_);
    released_changed_.wait_for(lock, std::chrono::seconds(hold_timeout_sec),
                               [this] { return released_; });
  }
  httplib::Client client(target_);
  client.set_read_timeout(relay_timeout_sec, 0);
  client.set_write_timeout(relay_timeout_sec, 0);
  const std::string type = req.get_header_value("Content-Type");
  httplib::Result r = req.method == "GET"
                          ? client.Get(target_of(req).c_str())
                          : client.Post(target_of(req).c_str(), req.body,
                                        type.empty() ? "application/json" : type.c_str());
  if (!r) {
    res.status = 502;
    res.set_content(httplib::to_string(r.error()), "text/plain");
    return;
  }
  std::string content_type = r->get_header_value("Content-Type");
  if (content_type.empty()) content_type = "application/json";
  if (fault == UpstreamFault::truncate) {
    ++delivered_;
    send_half(res, r->status, std::move(r->body), content_type);
    return;
  }
  res.status = r->status;
  res.set_content(r->body, content_type.c_str());
}

}  // namespace kvpark::testing
