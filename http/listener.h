// An admission layer in front of cpp-httplib, shared by kvparkd's status adapter and
// kvpark-proxy.
//
// cpp-httplib gives each connection a worker thread from the moment it is accepted,
// and its read timeout restarts with every byte, so a few clients sending a header
// byte a second hold every worker. Here one thread owns the listening socket and
// every connection until a whole request is in memory:
//  - the request head must arrive within limits::http_head_timeout_usec and
//    http_head_bytes_max, the body (Content-Length only; chunked request bodies get
//    411) within http_body_timeout_usec and the configured body_bytes_max (413);
//  - at most http_connections_max connections are held, http_connections_per_peer_max
//    from one address; at a cap, the oldest connection still sending its head gives
//    way to the new one (a flood of slow clients cannot lock out a fast one), and
//    when none is, the new one gets 503. A candidate is read before it is closed:
//    one whose whole request already arrived is served, never displaced;
//  - workers run httplib's routing on the buffered request (RouteServer::serve), so
//    a worker never waits for a client to send; keep-alive connections come back to
//    this thread between requests.
// The listening socket has SO_REUSEADDR (restart over TIME_WAIT) but never
// SO_REUSEPORT: a second listener on a port in use fails with EADDRINUSE.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "proto/limits.h"

namespace kvpark::http {

// httplib::Server whose routing runs on a request this layer already read.
class RouteServer : public httplib::Server {
 public:
  // Serves one buffered request on `stream`; false when the connection must close.
  bool serve(httplib::Stream& stream);
  // httplib ends streamed responses (content providers) once its own listening socket
  // is gone; the Listener lends it its socket while it serves, -1 when it stops.
  void set_listening_socket(int fd) { svr_sock_ = fd; }
};

// Whether the client of the request this thread is serving (in RouteServer::serve)
// has closed its connection, or the connection failed: a handler that waits long on
// the client's behalf (an upstream generating a whole answer) asks, and gives up.
// A client that only shut down its sending side counts as gone, as it does for
// nginx. Bytes of a next request waiting on the connection do not. false on a thread
// that serves no request.
bool client_hung_up();

struct ListenerOptions {
  std::string host;
  uint16_t port = 0;  // 0: any free port
  size_t worker_threads = 2;
  size_t body_bytes_max = limits::http_status_body_bytes_max;
  uint64_t head_timeout_usec = limits::http_head_timeout_usec;
  uint64_t body_timeout_usec = limits::http_body_timeout_usec;
  size_t connections_max = limits::http_connections_max;
  size_t connections_per_peer_max = limits::http_connections_per_peer_max;
};

struct ListenerCounters {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> head_timeouts{0};   // closed: no whole head in time
  std::atomic<uint64_t> body_timeouts{0};
  std::atomic<uint64_t> refused{0};         // 413, 411, 431, 400 or 503 at the door
  std::atomic<uint64_t> displaced{0};       // slow connections closed for a newer one
};

class Listener {
 public:
  Listener(RouteServer& routes, ListenerOptions options);
  ~Listener();  // stop()
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds and listens; false with "cannot listen on HOST:PORT: <strerror>" otherwise.
  bool bind(std::string& ret_error);
  uint16_t port() const { return port_; }
  // Serves until stop(); call after bind(), from any thread.
  void run();
  // Starts run() on a thread of its own.
  void start();
  // Stops accepting, closes every connection, joins the threads. Idempotent.
  void stop();
  const ListenerCounters& counters() const { return counters_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  ListenerCounters counters_;
};

}  // namespace kvpark::http
