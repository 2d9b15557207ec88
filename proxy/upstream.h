// A llama-server the proxy fronts: plain HTTP calls, one typed helper per endpoint
// the proxy relies on (/props, /slots, /apply-template, /tokenize, /completion,
// /slots/N?action=save|restore). Every call opens its own connection, so an
// Upstream may be used from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/options.h"

namespace httplib {
class Client;
}

namespace kvpark::proxy {

// What an HTTP call returned. status 0: no answer (connection refused, timeout).
// What an httplib error means, for messages ("could not connect", ...).
std::string describe_http_error(int httplib_error);

struct Reply {
  int status = 0;
  std::string body;
  std::string content_type;
  std::string error;  // why there was no answer, when status == 0
  bool ok() const { return status == 200; }
};

struct UpstreamProps {
  std::string model_path;
  std::string build_info;
  uint32_t total_slots = 0;
  bool slots_endpoint = true;  // false: started with --no-slots
};

// One slot as GET /slots reports it.
struct SlotReport {
  bool known = false;           // the slot has run a task since llama-server started
  uint32_t prompt_tokens = 0;   // tokens its cache holds (n_prompt_tokens)
};

// Ends an exchange post_streaming runs on another thread, at any point: its
// connection is shut down, so the upstream sees its client gone (llama-server then
// cancels the generation) even while it has sent nothing yet. An exchange not yet
// begun does not begin.
class ExchangeAbort {
 public:
  void abort();

 private:
  friend class Upstream;
  // Read by the exchange's socket setup, which runs under the client's own lock: no
  // mutex, or abort() (mutex, then that lock) could wait on it the other way round.
  std::atomic<bool> aborted_{false};
  std::mutex mutex_;
  httplib::Client* client_ = nullptr;  // while an exchange runs
};

class Upstream {
 public:
  explicit Upstream(UpstreamOptions options) : options_(std::move(options)) {}
  const UpstreamOptions& options() const { return options_; }
  // "llama-server at URL": how messages name it.
  std::string describe() const { return "llama-server at " + options_.url; }

  Reply get(const std::string& path) const;
  Reply post(const std::string& path, const std::string& body,
             const std::string& content_type = "application/json") const;
  // Streams the answer: on_status once with the status and content type, then
  // on_chunk for each piece of body; either returning false cancels the request, and
  // `abort` (when given) ends it from another thread.
  Reply post_streaming(const std::string& path, const std::string& body,
                       const std::function<bool(int, const std::string&)>& on_status,
                       const std::function<bool(const char*, size_t)>& on_chunk,
                       ExchangeAbort* abort = nullptr) const;

  bool props(UpstreamProps* ret_props, std::string* ret_error) const;
  // Reports for every slot, in slot order; false when /slots is unavailable.
  bool slots(std::vector<SlotReport>* ret_slots, Reply* ret_reply = nullptr) const;
  // The tokens of text (special tokens added and parsed); false with why.
  bool tokenize(const std::string& text, std::vector<int32_t>* ret_tokens,
                std::string* ret_error) const;
  // The prompt a chat request renders to, tokenized as the chat endpoint does it
  // (special tokens added and parsed). On failure, the upstream's reply.
  bool chat_tokens(const std::string& request_body, std::vector<int32_t>* ret_tokens,
                   Reply* ret_failure) const;
  // Prefills tokens into slot_id (a completion of 0 tokens, prompt cached). The tokens
  // llama-server computed and the milliseconds it took (timings; -1: not reported).
  bool prefill(uint32_t slot_id, const std::vector<int32_t>& tokens, size_t n_tokens,
               uint32_t* ret_prefilled, double* ret_prefill_msec, std::string* ret_error) const;
  // /slots/N?action=save|restore with a file name in the upstream's slot directory.
  // *ret_status: the HTTP status (0: no answer; 501: slot actions are disabled,
  // llama-server was started without --slot-save-path).
  bool save_slot(uint32_t slot_id, const std::string& file_name, uint32_t* ret_tokens,
                 std::string* ret_error, int* ret_status = nullptr) const;
  // *ret_refused: llama-server answered and refused the file (not unreachable).
  bool restore_slot(uint32_t slot_id, const std::string& file_name, uint32_t* ret_tokens,
                    std::string* ret_error, bool* ret_refused, int* ret_status = nullptr) const;

 private:
  UpstreamOptions options_;
};

}  // namespace kvpark::proxy
