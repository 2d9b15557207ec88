// OpenAI request parsing: see openai_request.h. RapidJSON is the foreign boundary
// here; it does not throw (no RAPIDJSON_ASSERT override is needed because every
// accessor is guarded by a type check) and parses iteratively, so deep nesting
// costs heap, not stack.
#include "client/openai_request.h"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <cassert>
#include <utility>

namespace kvpark::client {
namespace {

using rapidjson::Value;

std::string_view string_of(const Value& v) {
  assert(v.IsString());
  return {v.GetString(), v.GetStringLength()};
}

// The member, or null when absent. JSON null counts as absent for optional fields.
const Value* member(const Value& object, const char* name) {
  assert(object.IsObject());
  const auto it = object.FindMember(name);
  if (it == object.MemberEnd() || it->value.IsNull()) return nullptr;
  return &it->value;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string indexed(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

class Parser {
 public:
  RequestParseError error;

  bool fail(RequestParseStatus status, std::string path, std::string_view what) {
    error.status = status;
    error.message = (path.empty() ? std::string("request") : path) + ": " + std::string(what);
    error.path = std::move(path);
    return false;
  }
  bool shape(std::string path, std::string_view what) {
    return fail(RequestParseStatus::InvalidShape, std::move(path), what);
  }

  // prompt_cache_breakpoint (an object or a boolean) and cache_control (an object,
  // Anthropic style) on a message, content part, item or tool definition.
  bool parse_marks(const Value& object, const std::string& path, bool* ret_marked) {
    bool marked = false;
    if (const Value* v = member(object, "prompt_cache_breakpoint")) {
      if (v->IsObject() || v->IsBool()) {
        marked = v->IsObject() || v->GetBool();
      } else {
        return shape(path + ".prompt_cache_breakpoint", "expected an object or a boolean");
      }
    }
    if (const Value* v = member(object, "cache_control")) {
      if (!v->IsObject()) return shape(path + ".cache_control", "expected an object");
      marked = true;
    }
    *ret_marked = marked;
    return true;
  }

  // A content part: {"type": ..., "text": ...} and the like.
  bool parse_part(const Value& v, const std::string& path, ContentPart* ret_part) {
    if (!v.IsObject()) return shape(path, "expected an object");
    const Value* type = member(v, "type");
    if (type == nullptr) return shape(path + ".type", "missing");
    if (!type->IsString()) return shape(path + ".type", "expected a string");
    ContentPart part;
    part.type = string_of(*type);
    const char* text_field = nullptr;
    if (part.type == "text" || part.type == "input_text" || part.type == "output_text") {
      text_field = "text";
    } else if (part.type == "refusal") {
      text_field = "refusal";
    }
    if (text_field != nullptr) {
      const Value* text = member(v, text_field);
      if (text == nullptr) return shape(path + "." + text_field, "missing");
      if (!text->IsString()) return shape(path + "." + text_field, "expected a string");
      part.text = string_of(*text);
    }
    if (!parse_marks(v, path, &part.breakpoint)) return false;
    *ret_part = std::move(part);
    return true;
  }

  // Message content: a string, an array of parts, or (when allowed) null/absent.
  bool parse_content(const Value* content, const std::string& path, bool optional,
                     RequestMessage* message) {
    if (content == nullptr) {
      return optional ? true : shape(path, "missing; expected a string or an array");
    }
    if (content->IsString()) {
      message->parts.push_back(ContentPart{.type = "text", .text = std::string(string_of(*content))});
      return true;
    }
    if (!content->IsArray()) return shape(path, "expected a string or an array");
    if (content->Size() > message_parts_max) {
      return fail(RequestParseStatus::LimitExceeded, path, "too many content parts");
    }
    message->parts.reserve(content->Size());
    for (rapidjson::SizeType i = 0; i < content->Size(); ++i) {
      ContentPart part;
      if (!parse_part((*content)[i], indexed(path, i), &part)) return false;
      message->breakpoint = message->breakpoint || part.breakpoint;
      message->parts.push_back(std::move(part));
    }
    return true;
  }

  bool parse_role(const Value& v, const std::string& path, MessageRole* ret_role) {
    const Value* role = member(v, "role");
    if (role == nullptr) return shape(path + ".role", "missing");
    if (!role->IsString()) return shape(path + ".role", "expected a string");
    const std::string_view name = string_of(*role);
    if (name == "system") {
      *ret_role = MessageRole::System;
    } else if (name == "developer") {
      *ret_role = MessageRole::Developer;
    } else if (name == "user") {
      *ret_role = MessageRole::User;
    } else if (name == "assistant") {
      *ret_role = MessageRole::Assistant;
    } else if (name == "tool" || name == "function") {  // "function": legacy Chat role
      *ret_role = MessageRole::Tool;
    } else {
      return shape(path + ".role", "unknown role \"" + std::string(name) +
                                       "\"; expected system, developer, user, assistant or tool");
    }
    return true;
  }

  // A message object: Chat messages, and Responses items that carry a role.
  bool parse_message(const Value& v, const std::string& path, RequestMessage* ret_message) {
    RequestMessage message;
    if (!parse_role(v, path, &message.role)) return false;
    bool marked = false;
    if (!parse_marks(v, path, &marked)) return false;
    // Assistant turns may carry only tool calls (content null or absent).
    const bool optional = message.role == MessageRole::Assistant;
    if (!parse_content(member(v, "content"), path + ".content", optional, &message)) {
      return false;
    }
    message.breakpoint = message.breakpoint || marked;
    *ret_message = std::move(message);
    return true;
  }

  // A Responses input item: a message, or a typed item without a role.
  bool parse_item(const Value& v, const std::string& path, RequestMessage* ret_message) {
    if (!v.IsObject()) return shape(path, "expected an object");
    const Value* type = member(v, "type");
    if (type != nullptr && !type->IsString()) return shape(path + ".type", "expected a string");
    const std::string_view type_name = type != nullptr ? string_of(*type) : std::string_view();
    if (member(v, "role") != nullptr || type_name == "message") {
      if (!parse_message(v, path, ret_message)) return false;
      ret_message->item_type = "message";
      return true;
    }
    if (type == nullptr) return shape(path, "expected a \"role\" or a \"type\"");
    RequestMessage message;
    message.item_type = type_name;
    if (ends_with(type_name, "_output")) {
      message.role = MessageRole::Tool;
      const Value* output = member(v, "output");
      if (output != nullptr && !parse_content(output, path + ".output", true, &message)) {
        return false;
      }
    } else if (ends_with(type_name, "_call") || type_name == "reasoning") {
      message.role = MessageRole::Assistant;
    } else {
      message.role = MessageRole::Other;
    }
    bool marked = false;
    if (!parse_marks(v, path, &marked)) return false;
    message.breakpoint = message.breakpoint || marked;
    *ret_message = std::move(message);
    return true;
  }

  bool parse_tools(const Value& root, const char* name, ParsedRequest* request) {
    const Value* tools = member(root, name);
    if (tools == nullptr) return true;
    if (!tools->IsArray()) return shape(name, "expected an array");
    for (rapidjson::SizeType i = 0; i < tools->Size(); ++i) {
      const Value& tool = (*tools)[i];
      if (!tool.IsObject()) return shape(indexed(name, i), "expected an object");
      bool marked = false;
      if (!parse_marks(tool, indexed(name, i), &marked)) return false;
      request->tools_breakpoint = request->tools_breakpoint || marked;
    }
    request->tools_present = request->tools_present || tools->Size() > 0;
    return true;
  }

  bool parse_cache_options(const Value& root, ParsedRequest* request) {
    if (const Value* key = member(root, "prompt_cache_key")) {
      if (!key->IsString()) return shape("prompt_cache_key", "expected a string");
      request->prompt_cache_key = string_of(*key);
    }
    const Value* options = member(root, "prompt_cache_options");
    if (options == nullptr) return true;
    if (!options->IsObject()) return shape("prompt_cache_options", "expected an object");
    request->prompt_cache_options_present = true;
    if (const Value* mode = member(*options, "mode")) {
      if (!mode->IsString()) return shape("prompt_cache_options.mode", "expected a string");
      if (string_of(*mode) == "explicit") {
        request->explicit_mode = true;
      } else if (string_of(*mode) != "automatic") {
        return shape("prompt_cache_options.mode", "expected \"automatic\" or \"explicit\"");
      }
    }
    return true;
  }

  bool parse_chat(const Value& root, ParsedRequest* request) {
    const Value* messages = member(root, "messages");
    if (messages == nullptr) return shape("messages", "missing");
    if (!messages->IsArray()) return shape("messages", "expected an array");
    if (messages->Size() > request_messages_max) {
      return fail(RequestParseStatus::LimitExceeded, "messages", "too many messages");
    }
    request->messages.reserve(messages->Size());
    for (rapidjson::SizeType i = 0; i < messages->Size(); ++i) {
      const Value& v = (*messages)[i];
      const std::string path = indexed("messages", i);
      if (!v.IsObject()) return shape(path, "expected an object");
      RequestMessage message;
      if (!parse_message(v, path, &message)) return false;
      request->messages.push_back(std::move(message));
    }
    return parse_tools(root, "tools", request) && parse_tools(root, "functions", request);
  }

  bool parse_responses(const Value& root, ParsedRequest* request) {
    if (const Value* instructions = member(root, "instructions")) {
      if (!instructions->IsString()) return shape("instructions", "expected a string");
      RequestMessage message{.role = MessageRole::System, .item_type = "instructions"};
      message.parts.push_back(
          ContentPart{.type = "input_text", .text = std::string(string_of(*instructions))});
      request->messages.push_back(std::move(message));
    }
    if (const Value* input = member(root, "input")) {
      if (input->IsString()) {
        RequestMessage message{.role = MessageRole::User, .item_type = "message"};
        message.parts.push_back(
            ContentPart{.type = "input_text", .text = std::string(string_of(*input))});
        request->messages.push_back(std::move(message));
      } else if (input->IsArray()) {
        if (input->Size() + request->messages.size() > request_messages_max) {
          return fail(RequestParseStatus::LimitExceeded, "input", "too many input items");
        }
        request->messages.reserve(request->messages.size() + input->Size());
        for (rapidjson::SizeType i = 0; i < input->Size(); ++i) {
          RequestMessage message;
          if (!parse_item((*input)[i], indexed("input", i), &message)) return false;
          request->messages.push_back(std::move(message));
        }
      } else {
        return shape("input", "expected a string or an array");
      }
    }
    return parse_tools(root, "tools", request);
  }

  bool parse(const Value& root, RequestApi api, ParsedRequest* request) {
    if (!root.IsObject()) return shape("", "expected an object");
    if (api == RequestApi::Detect) {
      if (root.HasMember("messages")) {
        api = RequestApi::ChatCompletions;
      } else if (root.HasMember("input") || root.HasMember("instructions")) {
        api = RequestApi::Responses;
      } else {
        return shape("", "expected \"messages\" (Chat Completions) or \"input\" (Responses)");
      }
    }
    request->api = api;
    if (const Value* model = member(root, "model")) {
      if (!model->IsString()) return shape("model", "expected a string");
      request->model = string_of(*model);
    }
    if (!parse_cache_options(root, request)) return false;
    return api == RequestApi::ChatCompletions ? parse_chat(root, request)
                                              : parse_responses(root, request);
  }
};

bool is_head_role(MessageRole role) {
  return role == MessageRole::System || role == MessageRole::Developer;
}

}  // namespace

RequestParseStatus parse_openai_request(std::string_view body, RequestApi api,
                                        ParsedRequest* ret_request, RequestParseError* ret_error) {
  assert(ret_request != nullptr);
  Parser parser;
  rapidjson::Document document;
  document.Parse<rapidjson::kParseIterativeFlag>(body.data(), body.size());
  if (document.HasParseError()) {
    const std::string what = std::string("not JSON at byte ") +
                             std::to_string(document.GetErrorOffset()) + ": " +
                             rapidjson::GetParseError_En(document.GetParseError());
    parser.fail(RequestParseStatus::NotJson, "", what);
  } else {
    ParsedRequest request;
    if (parser.parse(document, api, &request)) {
      assert(request.api != RequestApi::Detect);
      assert(request.messages.size() <= request_messages_max);
      *ret_request = std::move(request);
      return RequestParseStatus::Ok;
    }
  }
  assert(parser.error.status != RequestParseStatus::Ok);
  const RequestParseStatus status = parser.error.status;
  if (ret_error != nullptr) *ret_error = std::move(parser.error);
  return status;
}

SegmentKind segment_kind_of(MessageRole role) {
  switch (role) {
    case MessageRole::System: return SegmentKind::System;
    case MessageRole::Developer: return SegmentKind::Developer;
    case MessageRole::User: return SegmentKind::User;
    case MessageRole::Assistant: return SegmentKind::Assistant;
    case MessageRole::Tool: return SegmentKind::ToolResult;
    case MessageRole::Other: return SegmentKind::Other;
  }
  assert(false && "role out of range");
  return SegmentKind::Other;
}

Status segments_from_request(const ParsedRequest& request, const RenderedOffsets& offsets,
                             std::vector<Segment>* ret_segments) {
  assert(ret_segments != nullptr);
  const size_t n = request.messages.size();
  if (offsets.message_end_tokens.size() != n) return Status::InvalidArgument;
  if (static_cast<uint8_t>(offsets.tools_placement) > 2) return Status::InvalidArgument;
  const bool with_tools =
      request.tools_present && offsets.tools_placement != ToolsPlacement::NotRendered;
  size_t tools_index = 0;  // the tools block renders before message tools_index
  if (offsets.tools_placement == ToolsPlacement::AfterLeadingSystem) {
    while (tools_index < n && is_head_role(request.messages[tools_index].role)) ++tools_index;
  }
  const Segment tools{.kind = SegmentKind::Tools,
                      .end_token = offsets.tools_end_token,
                      .explicit_breakpoint = request.tools_breakpoint};

  std::vector<Segment> segments;
  segments.reserve(n + 1);
  for (size_t i = 0; i < n; ++i) {
    if (with_tools && i == tools_index) segments.push_back(tools);
    segments.push_back(Segment{.kind = segment_kind_of(request.messages[i].role),
                               .end_token = offsets.message_end_tokens[i],
                               .explicit_breakpoint = request.messages[i].breakpoint});
  }
  if (with_tools && tools_index == n) segments.push_back(tools);

  for (size_t i = 1; i < segments.size(); ++i) {
    if (segments[i].end_token < segments[i - 1].end_token) return Status::InvalidArgument;
  }
  *ret_segments = std::move(segments);
  return Status::Ok;
}

WritePlanOptions write_plan_options(const ParsedRequest& request, uint32_t total_tokens,
                                    bool automatic_system_candidate_enabled) {
  return WritePlanOptions{
      .prompt_cache_options_present = request.prompt_cache_options_present,
      .explicit_mode = request.explicit_mode,
      .automatic_system_candidate_enabled = automatic_system_candidate_enabled,
      .total_tokens = total_tokens,
  };
}

}  // namespace kvpark::client
