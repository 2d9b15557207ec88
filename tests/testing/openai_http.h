// A small OpenAI-style HTTP client for the proxy's end-to-end tests and bench, on
// cpp-httplib and RapidJSON: plain GET/POST, chat completions (whole or streamed as
// server-sent events, timing the first content chunk on the client side),
// llama-server's Prometheus counters, /tokenize, and the proxy's /kvpark/status.
// Also deterministic English-like prompt text built from the test model's word pieces.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kvpark::testing {

constexpr int http_timeout_msec_default = 300'000;

struct HttpResult {
  int status = 0;  // HTTP status; 0 when no response came (connection refused, timeout)
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-case
  std::string header(const std::string& name_lower) const;
};

HttpResult http_get(const std::string& base_url, const std::string& path,
                    int timeout_msec = http_timeout_msec_default);
HttpResult http_post(const std::string& base_url, const std::string& path, const std::string& body,
                     const std::string& content_type = "application/json",
                     int timeout_msec = http_timeout_msec_default);
// POSTs a JSON `body` asking for server-sent events; each piece of the answer's body
// goes to on_piece as it arrives (and into the result's body). Status 0: no response.
HttpResult http_post_streamed(const std::string& base_url, const std::string& path,
                              const std::string& body,
                              const std::function<void(const char*, size_t)>& on_piece,
                              int timeout_msec = http_timeout_msec_default);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatRequest {
  std::string model;  // "" : no "model" field
  std::vector<ChatMessage> messages;
  bool stream = false;
  int max_tokens = 8;
  // false adds "cache_prompt": false, so llama-server prefills the whole prompt
  // (a reference answer that no cache touched).
  bool cache_prompt = true;
  // Asks for each generated token's log-probability (choices[0].logprobs): answers
  // compared beyond the text they decode to.
  bool logprobs = false;
};

// The request body: temperature 0, seed 42; streamed ones ask for usage.
std::string chat_request_json(const ChatRequest& request);

struct ChatResult {
  HttpResult http;                 // streamed: body holds the raw event stream
  std::string content;             // choices[0].message.content, or the deltas concatenated
  std::string finish_reason;       // "" if none came
  int64_t prompt_tokens = -1;      // usage.prompt_tokens
  int64_t cached_tokens = -1;      // usage.prompt_tokens_details.cached_tokens
  int64_t prompt_n = -1;           // timings.prompt_n: tokens prefilled for this request
  int64_t cache_n = -1;            // timings.cache_n
  double first_chunk_msec = -1;    // streamed: request sent -> first data event
  double first_content_msec = -1;  // streamed: request sent -> first non-empty content
  double total_msec = 0;
  bool parsed = false;  // the body (or a final event) was the JSON expected
  int64_t header_int(const std::string& name_lower) const;  // -1 if absent
};

// POST /v1/chat/completions.
ChatResult post_chat(const std::string& base_url, const ChatRequest& request,
                     int timeout_msec = http_timeout_msec_default);

// llama-server's llamacpp:prompt_tokens_total (tokens prefilled since it started),
// from GET /metrics; -1 if unavailable.
int64_t prompt_tokens_total(const std::string& llama_server_url);

// Tokens llama-server makes of `text` (POST /tokenize, no special tokens); -1 on error.
int64_t count_tokens(const std::string& llama_server_url, const std::string& text);
// The tokens of `text` (POST /tokenize); special: added and parsed, as llama-server's
// chat endpoint tokenizes a rendered prompt. false on error.
bool tokenize(const std::string& llama_server_url, const std::string& text, bool special,
              std::vector<int32_t>* ret_tokens);

struct ProxyUpstreamStatus {
  std::string name, url, space;  // space: the namespace, 32 hex digits
  std::string memory;            // kv_cache, sliding_window, recurrent
  std::string parking;           // "blocks", or "whole: <why>"
  int64_t block_tokens = -1;     // 0: whole slot files
  int64_t block_bytes = -1;
  int64_t slots = -1;
  int64_t busy_slots = -1;  // taken by the proxy now
  bool restores_discarded = false;
};

struct ProxyStatus {
  bool parsed = false;
  bool kvparkd_connected = false;
  int64_t requests = -1, uncached_requests = -1, head_prefills = -1, head_waits = -1, restores = -1,
          restore_failures = -1, publishes = -1, abandoned = -1;
  std::vector<ProxyUpstreamStatus> upstreams;
  std::string body;
};

// GET /kvpark/status of a kvpark-proxy.
ProxyStatus get_proxy_status(const std::string& proxy_url);

// The "error" object of an OpenAI-style error body.
struct ErrorBody {
  bool parsed = false;
  std::string message, type;
  int64_t code = -1;
};
ErrorBody parse_error_body(const std::string& body);

// Deterministic English-like text of `words` words from the test model's word
// pieces (" the", " park", " cache", ...), with sentence breaks. Its tokenizer
// merges pairs of pieces, so a word is about 4 tokens: count with count_tokens().
std::string english_text(size_t words, uint64_t seed);

// Median and maximum of a non-empty sample.
double median_of(std::vector<double> values);
double max_of(const std::vector<double>& values);

}  // namespace kvpark::testing
