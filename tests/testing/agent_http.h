// Agent clients' two other wire formats for the proxy's end-to-end tests and bench:
// OpenAI Responses and Anthropic Messages requests shaped as the official SDKs send
// them (public API references), whole or streamed, with the prompt figures each
// format's usage reports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/testing/openai_http.h"

namespace kvpark::testing {

enum class WireFormat { chat, responses, messages };
const char* wire_format_string(WireFormat format);  // "chat", "responses", "messages"

struct AgentRequest {
  WireFormat format = WireFormat::responses;
  std::string model = "m";
  std::string system;               // Responses "instructions"; Messages "system"
  std::vector<ChatMessage> turns;   // user / assistant, in order
  bool stream = false;
  int max_tokens = 8;
  // Messages: "system" as blocks, the first a Claude-Code-style billing line stamped
  // with this cch (5 characters; "": no such line, "system" a plain string).
  std::string billing_cch;
  bool mark_system = false;         // Messages: cache_control on the system block
  bool cache_prompt = true;         // false: "cache_prompt": false (Responses keeps it)
};

// The request body: temperature 0.
std::string agent_request_json(const AgentRequest& request);
// The path it is posted to: /v1/chat/completions, /v1/responses or /v1/messages.
const char* agent_request_path(WireFormat format);

struct AgentResult {
  HttpResult http;        // streamed: body holds the raw event stream
  std::string content;    // the answer's text (output_text / text blocks, or their deltas)
  bool parsed = false;    // the body (or its closing event) was the JSON expected
  bool stream_closed = false;  // streamed: the closing event (response.completed, message_stop)
  // The prompt as usage reports it: Responses input_tokens and cached_tokens;
  // Messages input_tokens + cache_read + cache_creation and cache_read; chat
  // prompt_tokens and cached_tokens. -1 when absent.
  int64_t prompt_tokens = -1;
  int64_t cached_tokens = -1;
  int64_t cache_creation_tokens = -1;  // Messages only
  int64_t input_tokens = -1;           // Messages only: neither read nor created
  double first_content_msec = -1;      // streamed: request sent -> first text delta
  double total_msec = 0;
  std::string error_type;              // an error body's type (either format's shape)
  std::string error_message;
  int64_t header_int(const std::string& name_lower) const;  // -1 if absent
};

AgentResult post_agent(const std::string& base_url, const AgentRequest& request,
                       int timeout_msec = http_timeout_msec_default);

}  // namespace kvpark::testing
