// The proxy's three front doors. Every request becomes the Chat Completions body
// llama-server itself would render for it (llama-server converts Responses and
// Messages to Chat Completions before templating: server_chat_convert_responses_to_chatcmpl
// and server_chat_convert_anthropic_to_oai in the pinned build, mirrored here field for
// field, so the proxy's frontiers are the tokens llama-server prefills). The answer goes
// back in the client's own format: Responses through llama-server's /v1/responses
// (which keeps id_slot), Messages converted from the Chat Completions answer here
// (llama-server's Messages converter drops id_slot, so a pinned request must be sent
// as chat).
#pragma once

#include <rapidjson/document.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::proxy {

enum class Api { chat_completions, responses, messages, count };
const char* api_string(Api api);  // "chat_completions", "responses", "messages"

// ---- OpenAI Responses (responses_format.cpp) --------------------------------------

// The Chat Completions body llama-server converts `body` (a /v1/responses request) to:
// "instructions" as a leading system message, "input" (a string, or input items:
// messages, function calls and their outputs, reasoning) as messages, function tools as
// chat tools, max_output_tokens as max_tokens, reasoning.effort as reasoning_effort;
// every other member copied. false, with the reason in *ret_error (as llama-server words
// it), when llama-server would refuse the body.
bool responses_to_chat(const rapidjson::Value& body, rapidjson::Document& ret_chat,
                       std::string* ret_error);

// The prompt figures of a Responses answer, non-streamed (the response object) or the
// "response" of a streamed response.completed event: usage.input_tokens and
// usage.input_tokens_details.cached_tokens. false when absent.
bool responses_usage(const rapidjson::Value& response, uint32_t* ret_input_tokens,
                     uint32_t* ret_cached_tokens);
// Sets usage.input_tokens_details.cached_tokens of that response object (creating
// the details object if needed). Does nothing when it has no usage object.
void set_responses_cached_tokens(rapidjson::Value& response, uint32_t cached_tokens,
                                 rapidjson::Document::AllocatorType& allocator);

// llama-server's streamed Responses events, completed with what OpenAI's format has and
// llama-server leaves out, so the official SDKs' accumulators (openai-node's
// responses.stream()) can follow them: sequence_number on every event, "output": [] on
// the response of response.created and response.in_progress, output_index on every
// item event (the items in the order they were added), content_index 0 on part events
// (llama-server writes one part per item), and the reasoning_text part a reasoning item
// gets before its first delta, which llama-server never announces.
class ResponsesStream {
 public:
  // Completes one event (its data JSON, changed in place). Returns the events to send
  // after it, whole ("event: NAME\ndata: JSON\n\n"); "" for none.
  std::string complete(rapidjson::Document& data);

 private:
  uint64_t next_sequence_ = 0;
  std::vector<std::string> items_;  // item ids, by output index
};

// ---- Anthropic Messages (messages_format.cpp) -------------------------------------

// The Chat Completions body llama-server converts `body` (a /v1/messages request) to.
// With normalize_billing_header, a system text starting "x-anthropic-billing-header:"
// has the five characters after its "cch=" replaced by "fffff" when a ';' follows them,
// as llama-server does (the stamp changes per request and would break every prefix);
// *ret_normalized counts the texts changed. Anthropic cache_control marks are kept
// where the proxy's request parser reads them: a marked system block marks the system
// message ("cache_control" on the message object), a marked tool marks its chat tool,
// a marked content block of a message marks the chat message it becomes (llama-server
// ignores both members). false, with the reason, when llama-server would refuse it.
bool messages_to_chat(const rapidjson::Value& body, bool normalize_billing_header,
                      rapidjson::Document& ret_chat, int* ret_normalized,
                      std::string* ret_error);

// The top-level members of a /v1/messages body that llama-server's converter, and so
// the proxy's, leaves out ("service_tier", "mcp_servers", ...): said once each in the
// log rather than dropped in silence.
std::vector<std::string> messages_ignored_fields(const rapidjson::Value& body);

// What a Messages answer reports of its prompt. The three input figures add up to the
// prompt's tokens.
struct MessagesUsage {
  uint32_t input_tokens = 0;                 // prefilled and not parked
  uint32_t cache_read_input_tokens = 0;      // not prefilled: restored or kept in the slot
  uint32_t cache_creation_input_tokens = 0;  // prefilled and parked for later requests
  uint32_t output_tokens = 0;
};

// A non-streamed Chat Completions answer of llama-server as a Messages answer, as
// llama-server's own /v1/messages writes it: id, "type":"message", role, content
// blocks (thinking from reasoning_content, text, tool_use with the arguments parsed,
// {} when they do not parse), model, stop_reason (finish_reason "stop": "end_turn",
// or "tool_use" with tool calls; "length": "max_tokens"; "tool_calls": "tool_use"),
// stop_sequence null, usage. false when `chat` is not such an answer.
bool chat_answer_to_message(const rapidjson::Value& chat, const MessagesUsage& usage,
                            std::string* ret_body);

// A streamed Chat Completions answer as Messages server-sent events, one chunk at a
// time: message_start before anything else, content_block_start / _delta / _stop per
// block (thinking, text, tool_use, in the order they begin; a block is stopped before
// the next starts), then message_delta (stop_reason, usage) and message_stop.
class MessagesStream {
 public:
  // The events for one Chat Completions chunk (the JSON after "data: "); "" for none.
  // Records finish_reason; a chunk without choices (the usage chunk) yields nothing.
  std::string on_chunk(const rapidjson::Value& chunk);
  // The closing events: stops an open block, then message_delta with the stop reason
  // and `usage`, then message_stop. Once; "" on later calls.
  std::string finish(const MessagesUsage& usage);
  bool started() const { return started_; }

 private:
  enum class Block { none, thinking, text, tool_use };
  std::string start_message(const rapidjson::Value& chunk);
  std::string stop_block();
  bool started_ = false;
  bool finished_ = false;
  Block open_ = Block::none;
  int open_tool_ = -1;       // the chat tool_calls index of the open tool_use block
  int next_index_ = 0;       // the next content block's index
  std::string stop_reason_ = "end_turn";
  bool tool_calls_seen_ = false;
};

// An Anthropic error body: {"type":"error","error":{"type":TYPE,"message":MESSAGE}}.
std::string messages_error_body(const std::string& type, const std::string& message);
// The Anthropic error type for an HTTP status: 400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413
// request_too_large, 429 rate_limit_error, 503/502 overloaded_error/api_error, else
// api_error.
const char* messages_error_type(int status);
// An upstream's OpenAI-style error body ({"error":{"message",...}}) in Anthropic's
// shape, keeping its message; a body that is not one becomes an api_error naming it.
std::string messages_error_from_openai(int status, const std::string& openai_body);

}  // namespace kvpark::proxy
