// Relays one upstream response to the client as it arrives: the upstream request
// runs on its own thread and hands over chunks; the client side pulls them from an
// httplib content provider. Server-sent events can be rewritten one event at a time.
#pragma once

#include <chrono>
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

// How often a relay waiting on a client's behalf asks whether the client is still
// there (Relay::wait_*_unless): the longest an upstream keeps generating for a
// client that left.
inline constexpr std::chrono::milliseconds client_watch_interval{100};
// The status a request whose client hung up first ends with (in logs; no one reads
// it), as nginx has it.
inline constexpr int client_closed_request = 499;

class Relay {
 public:
  Relay(const Upstream& upstream, std::string path, std::string body);
  ~Relay();  // abandons the upstream request if it still runs, and joins
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  // Waits for the status line: 0 when the upstream could not be reached.
  int wait_status(std::string* ret_content_type);
  // Wait for the status line, or for the whole exchange to end, while
  // `client_gone` (asked every client_watch_interval) says the client still waits;
  // once it says otherwise the exchange is abandoned and they return false.
  // llama-server sends nothing of a reply that is not streamed until it is whole.
  bool wait_status_unless(const std::function<bool()>& client_gone);
  bool wait_end_unless(const std::function<bool()>& client_gone);
  // Waits for the end and returns the body as it came (for a reply that is not
  // relayed): all of it only if body_complete().
  std::string wait_body();
  // The next chunk; false at the end of the body.
  bool next_chunk(std::string* ret_chunk);
  void cancel();               // the request ends at the upstream's next chunk
  void abandon();              // the request ends now: its connection is shut down
  const std::string& error();  // why the upstream could not be reached, or broke off
  // Waits for the end: whether the upstream's body arrived whole. false: the
  // exchange failed after the status line (the upstream died or closed mid-body,
  // or the request was cancelled), so what came is not an answer.
  bool body_complete();
  // "llama-server at URL broke off mid-response: <error>", for messages.
  std::string failure();

 private:
  bool wait_unless(const std::function<bool()>& done, const std::function<bool()>& client_gone);

  ExchangeAbort abort_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int status_ = -1;
  std::string content_type_;
  std::deque<std::string> chunks_;
  bool finished_ = false;
  bool cancelled_ = false;
  bool complete_ = false;  // set with finished_
  std::string error_;
  std::string who_;  // the upstream, as messages name it
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

// How a relayed stream ended.
enum class StreamEnd {
  completed,        // the whole body reached the client
  client_gone,      // the client went away (or could not be written to) first
  upstream_failed,  // the upstream's body broke off; the client's stream was broken too
};

// Streams the relay's event stream to the client (status 200, the upstream's content
// type), each chunk through `transform` (last: the end, no chunk); `on_end` runs once
// the response is written or abandoned. When the upstream breaks off, what is held
// back is dropped and the client's stream ends in an error event and no last chunk.
void stream_to_client(std::shared_ptr<Relay> relay, httplib::Response& res,
                      const std::string& content_type,
                      std::function<std::string(const std::string&, bool last)> transform,
                      std::function<void(StreamEnd end)> on_end);

// An OpenAI-style error body: {"error": {"message", "type", "code"}}.
std::string error_body(int status, const std::string& type, const std::string& message);

// Sends a whole body, then runs `after` once it is written (or abandoned).
void send_then(httplib::Response& res, int status, std::string body,
               const std::string& content_type, std::function<void()> after);

}  // namespace kvpark::proxy
