// Relays one upstream response to the client as it arrives: the upstream request
// runs on its own thread and hands over chunks; the client side pulls them from an
// httplib content provider. Server-sent events can be rewritten one event at a time.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "proxy/upstream.h"

namespace httplib {
struct Response;
}

namespace kvpark::proxy {

class Relay {
 public:
  Relay(const Upstream& upstream, std::string path, std::string body);
  ~Relay();  // cancels the upstream request if it still runs, and joins
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Waits for the status line: 0 when the upstream could not be reached.
  int wait_status(std::string* ret_content_type);
  // Waits for the end and returns the whole body (for a reply that is not relayed).
  std::string wait_body();
  // The next chunk; false at the end of the body.
  bool next_chunk(std::string* ret_chunk);
  void cancel();
  const std::string& error();  // why the upstream could not be reached

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int status_ = -1;
  std::string content_type_;
  std::deque<std::string> chunks_;
  bool finished_ = false;
  bool cancelled_ = false;
  std::string error_;
  std::thread thread_;
};

// Splits an event stream into events ("...\n\n"), passing each through rewrite.
class EventSplitter {
 public:
  explicit EventSplitter(std::function<std::string(std::string)> rewrite)
      : rewrite_(std::move(rewrite)) {}
  // Appends bytes; returns the complete events, rewritten.
  std::string feed(const std::string& bytes);
  std::string flush();  // what is left at the end, as is

 private:
  std::function<std::string(std::string)> rewrite_;
  std::string pending_;
};

// Streams the relay's body to the client (status 200, the upstream's content type),
// each chunk through `transform` (last: the end, no chunk); `on_end` runs once the
// response is written (true) or abandoned by the client (false).
void stream_to_client(std::shared_ptr<Relay> relay, httplib::Response& res,
                      const std::string& content_type,
                      std::function<std::string(const std::string&, bool last)> transform,
                      std::function<void(bool completed)> on_end);

// Sends a whole body, then runs `after` once it is written (or abandoned).
void send_then(httplib::Response& res, int status, std::string body,
               const std::string& content_type, std::function<void()> after);

}  // namespace kvpark::proxy
