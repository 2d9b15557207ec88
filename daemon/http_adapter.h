// The HTTP adapter: Prometheus metrics and JSON status over cpp-httplib.
//
// Read-only. It runs its own thread(s) and asks the daemon through Control
// (control.h), which carries every call onto the event loop. Routes:
//   GET /metrics        Prometheus text format 0.0.4
//   GET /v1/status      StatusInfo as one JSON object (keys are its field names)
//   GET /v1/namespaces  {"namespaces": [...]}
//   GET /v1/entries     ?namespace=HEX32&tier=host|disk&class=shared|private&offset=N&limit=N
//   GET /v1/entries/ID  one entry (404 when there is none)
// Documents follow proto/json_schema.h: 64-bit identifiers are strings.
// Other methods get 405, unknown paths 404, bad query parameters 400, each with a
// JSON {"error": "..."} body. httplib and RapidJSON stay inside this adapter.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/control.h"

namespace kvpark::daemon {

inline constexpr uint64_t http_entries_limit_max = 1000;  // entries per /v1/entries page
inline constexpr uint64_t http_entries_limit_default = 100;
inline constexpr int http_worker_threads = 2;

class HttpAdapter {
 public:
  explicit HttpAdapter(Control& control);
  ~HttpAdapter();  // stop()
  HttpAdapter(const HttpAdapter&) = delete;
  HttpAdapter& operator=(const HttpAdapter&) = delete;

  // Binds host:port (port 0: any free port) and starts serving on a thread.
  bool start(const std::string& host, uint16_t port, std::string& ret_error);
  uint16_t port() const { return port_; }  // the bound port once started
  // Stops accepting and joins the thread. Call after the loop queue is closed,
  // so no handler waits on a loop that no longer runs.
  void stop();

 private:
  struct Impl;
  Control& control_;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

// Pure renderers, shared by the routes and the tests.
std::string render_metrics(const StatusInfo& status, const std::vector<NamespaceSummary>& spaces);

}  // namespace kvpark::daemon
