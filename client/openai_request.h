// Parsing of OpenAI request bodies (Chat Completions and Responses) into what the
// write-candidate planner needs: the messages in order with their roles and
// breakpoint marks, whether tools are present, and the prompt-cache options.
//
// The parser never throws and never recurses on the JSON (RapidJSON's iterative
// mode), so any byte string gives either a parse or an error naming the JSON path
// ("messages[2].content: expected a string or an array"). What is accepted, and
// the `prompt_cache_options` fields, are in docs/architecture.md ("Write-candidate
// planning"). Token offsets come from the engine's renderer: segments_from_request()
// joins them with a parsed request into the planner's segments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/write_candidates.h"
#include "proto/status.h"

namespace kvpark::client {

// Messages (Responses: input items, plus `instructions`) one request may carry.
inline constexpr size_t request_messages_max = 65536;
// Content parts one message may carry.
inline constexpr size_t message_parts_max = 4096;

enum class RequestApi : uint8_t {
  Detect = 0,           // "messages" → Chat Completions, else "input" → Responses
  ChatCompletions = 1,  // POST /v1/chat/completions
  Responses = 2,        // POST /v1/responses
};

enum class MessageRole : uint8_t {
  System = 0,     // also Responses `instructions`
  Developer = 1,
  User = 2,
  Assistant = 3,  // also Responses function_call / *_call / reasoning items
  Tool = 4,       // tool results: Chat "tool"/"function", Responses *_output items
  Other = 5,      // Responses items of another type (e.g. item_reference)
};

struct ContentPart {
  std::string type;  // "text", "input_text", "image_url", ...; "text" for string content
  std::string text;  // the text of text-like parts; empty otherwise
  bool breakpoint = false;  // prompt_cache_breakpoint or cache_control on the part
};

struct RequestMessage {
  MessageRole role = MessageRole::User;
  std::string item_type;  // Responses item "type" ("message", "function_call", ...); "" in Chat
  std::vector<ContentPart> parts;
  bool breakpoint = false;  // on the message itself or on any of its parts
};

struct ParsedRequest {
  RequestApi api = RequestApi::ChatCompletions;  // never Detect after a parse
  std::string model;                             // "" when absent
  std::vector<RequestMessage> messages;          // render order
  bool tools_present = false;                    // a non-empty "tools" (or "functions")
  bool tools_breakpoint = false;                 // a mark on any tool definition
  bool prompt_cache_options_present = false;
  bool explicit_mode = false;                    // prompt_cache_options.mode == "explicit"
  std::string prompt_cache_key;                  // "" when absent
};

enum class RequestParseStatus : uint8_t {
  Ok = 0,
  NotJson = 1,        // the body is not well-formed JSON
  InvalidShape = 2,   // JSON, but not a request this parser accepts
  LimitExceeded = 3,  // more messages or parts than the limits above
};

struct RequestParseError {
  RequestParseStatus status = RequestParseStatus::Ok;
  std::string path;     // JSON path of the offending value ("messages[2].content"); "" = root
  std::string message;  // "<path>: <what was expected>", ready to show a client
};

// Parses one request body. On failure ret_request is untouched and ret_error says why
// (ret_error may be null). Never throws.
RequestParseStatus parse_openai_request(std::string_view body, RequestApi api,
                                        ParsedRequest* ret_request, RequestParseError* ret_error);

// Where the engine's chat template renders the tools block.
enum class ToolsPlacement : uint8_t {
  BeforeMessages = 0,       // first, before every message
  AfterLeadingSystem = 1,   // right after the leading system/developer messages
  NotRendered = 2,          // the template drops or inlines it: no tools segment
};

struct RenderedOffsets {
  std::span<const uint32_t> message_end_tokens;  // tokens: one per parsed message, in order
  uint32_t tools_end_token = 0;                  // tokens: end of the tools block
  ToolsPlacement tools_placement = ToolsPlacement::BeforeMessages;
};

// The planner's segments for a parsed request rendered with these offsets: one per
// message, plus the tools block when tools_present and it is rendered. InvalidArgument
// when the count of offsets differs from the count of messages or the offsets are not
// monotonic in render order; ret_segments is untouched then.
Status segments_from_request(const ParsedRequest& request, const RenderedOffsets& offsets,
                             std::vector<Segment>* ret_segments);

// The planner's options for a parsed request.
WritePlanOptions write_plan_options(const ParsedRequest& request, uint32_t total_tokens,
                                    bool automatic_system_candidate_enabled);

SegmentKind segment_kind_of(MessageRole role);

}  // namespace kvpark::client
