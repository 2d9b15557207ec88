// OpenAI Responses requests as the Chat Completions body llama-server renders for them
// (server_chat_convert_responses_to_chatcmpl, mirrored branch for branch), and usage.
#include "proxy/wire_formats.h"

#include <string>
#include <utility>

namespace kvpark::proxy {
namespace {

using rapidjson::kArrayType;
using rapidjson::kObjectType;
using rapidjson::Value;
using Allocator = rapidjson::Document::AllocatorType;

// The last member named `name`, as llama-server's JSON library keeps the last of duplicate
// keys; nullptr when absent or `object` is not an object.
const Value* member(const Value& object, const char* name) {
  if (!object.IsObject()) return nullptr;
  const Value* found = nullptr;
  for (const auto& m : object.GetObject())
    if (m.name == name) found = &m.value;
  return found;
}

Value* member(Value& object, const char* name) {
  return const_cast<Value*>(member(static_cast<const Value&>(object), name));
}

bool has_string(const Value& object, const char* name) {
  const Value* value = member(object, name);
  return value && value->IsString();
}

bool has_array(const Value& object, const char* name) {
  const Value* value = member(object, name);
  return value && value->IsArray();
}

bool member_is(const Value& object, const char* name, const char* text) {
  const Value* value = member(object, name);
  return value && *value == text;
}

// llama-server's json_value(object, name, std::string()): anything but a string reads "".
std::string string_or_empty(const Value& object, const char* name) {
  const Value* value = member(object, name);
  return value && value->IsString() ? std::string(value->GetString(), value->GetStringLength())
                                    : std::string();
}

void erase_members(Value& object, const char* name) {
  for (auto it = object.MemberBegin(); it != object.MemberEnd();)
    it = it->name == name ? object.EraseMember(it) : it + 1;
}

// Replaces every member named `name` with one holding `value`; returns the new member.
Value& set_member(Value& object, const char* name, Value value, Allocator& allocator) {
  erase_members(object, name);
  object.AddMember(rapidjson::StringRef(name), value, allocator);
  return (object.MemberEnd() - 1)->value;
}

Value copy(const Value& value, Allocator& allocator) {
  return Value(value, allocator);
}

bool fail(std::string* ret_error, const char* message) {
  if (ret_error) *ret_error = message;
  return false;
}

// The input items, in order, as chat messages.
class MessageBuilder {
 public:
  MessageBuilder(Allocator& allocator, std::string* ret_error)
      : allocator_(allocator), ret_error_(ret_error) {}

  void add_system(const std::string& instructions) {
    push_role_message("system", Value(instructions.c_str(), instructions.size(), allocator_));
  }

  bool add_input(const Value& input) {
    if (input.IsString()) {
      push_role_message("user", copy(input, allocator_));
      return true;
    }
    if (!input.IsArray()) return fail(ret_error_, "'input' must be a string or array of objects");
    for (const Value& item : input.GetArray()) {
      Value item_copy = copy(item, allocator_);
      if (!add_item(item_copy)) return false;
    }
    return true;
  }

  Value take_messages() { return std::move(messages_); }

 private:
  bool add_item(Value& item) {
    const bool merge_prev =
        !messages_.Empty() && member_is(messages_[messages_.Size() - 1], "role", "assistant");
    // A string content becomes one input_text part, so every branch below sees parts.
    if (has_string(item, "content")) {
      Value part(kObjectType);
      part.AddMember("text", copy(*member(item, "content"), allocator_), allocator_);
      part.AddMember("type", "input_text", allocator_);
      Value parts(kArrayType);
      parts.PushBack(part, allocator_);
      set_member(item, "content", std::move(parts), allocator_);
    }
    if (has_array(item, "content") &&
        (member_is(item, "role", "user") || member_is(item, "role", "system") ||
         member_is(item, "role", "developer")))
      return add_input_message(item);
    if (member_is(item, "role", "assistant") && member_is(item, "type", "message"))
      return add_output_message(item, merge_prev);
    if (has_string(item, "arguments") && has_string(item, "call_id") && has_string(item, "name") &&
        member_is(item, "type", "function_call")) {
      add_function_call(item, merge_prev);
      return true;
    }
    if (has_string(item, "call_id") && (has_string(item, "output") || has_array(item, "output")) &&
        member_is(item, "type", "function_call_output"))
      return add_function_call_output(item);
    if (has_array(item, "summary") && member_is(item, "type", "reasoning"))
      return add_reasoning(item, merge_prev);
    return fail(ret_error_, "Cannot determine type of 'item'");
  }

  bool add_input_message(Value& item) {
    Value parts(kArrayType);
    for (const Value& part : member(item, "content")->GetArray()) {
      const std::string type = string_or_empty(part, "type");
      Value chat_part(kObjectType);
      if (type == "input_text") {
        if (!member(part, "text")) return fail(ret_error_, "'Input text' requires 'text'");
        chat_part.AddMember("text", copy(*member(part, "text"), allocator_), allocator_);
        chat_part.AddMember("type", "text", allocator_);
      } else if (type == "input_image") {
        if (!member(part, "image_url")) return fail(ret_error_, "'image_url' is required");
        Value image_url(kObjectType);
        image_url.AddMember("url", copy(*member(part, "image_url"), allocator_), allocator_);
        chat_part.AddMember("image_url", image_url, allocator_);
        chat_part.AddMember("type", "image_url", allocator_);
      } else if (type == "input_file") {
        return fail(ret_error_, "'input_file' is not supported by llamacpp at this moment");
      } else {
        return fail(ret_error_,
                    "'type' must be one of 'input_text', 'input_image', or 'input_file'");
      }
      parts.PushBack(chat_part, allocator_);
    }
    push_message(item, std::move(parts));
    return true;
  }

  bool add_output_message(Value& item, bool merge_prev) {
    Value parts(kArrayType);
    if (has_array(item, "content")) {
      for (const Value& part : member(item, "content")->GetArray()) {
        const std::string type = string_or_empty(part, "type");
        Value chat_part(kObjectType);
        if (type == "output_text" || type == "input_text") {
          if (!has_string(part, "text")) return fail(ret_error_, "'Output text' requires 'text'");
          chat_part.AddMember("text", copy(*member(part, "text"), allocator_), allocator_);
          chat_part.AddMember("type", "text", allocator_);
        } else if (type == "refusal") {
          if (!has_string(part, "refusal")) return fail(ret_error_, "'Refusal' requires 'refusal'");
          chat_part.AddMember("refusal", copy(*member(part, "refusal"), allocator_), allocator_);
          chat_part.AddMember("type", "refusal", allocator_);
        } else {
          return fail(ret_error_, "'type' must be one of 'output_text' or 'refusal'");
        }
        parts.PushBack(chat_part, allocator_);
      }
    }
    if (!merge_prev) {
      push_message(item, std::move(parts));
      return true;
    }
    Value& prev = last_message();
    Value* prev_parts = member(prev, "content");
    if (!prev_parts || !prev_parts->IsArray())
      prev_parts = &set_member(prev, "content", Value(kArrayType), allocator_);
    for (Value& part : parts.GetArray()) prev_parts->PushBack(part, allocator_);
    return true;
  }

  void add_function_call(const Value& item, bool merge_prev) {
    Value function(kObjectType);
    function.AddMember("arguments", copy(*member(item, "arguments"), allocator_), allocator_);
    function.AddMember("name", copy(*member(item, "name"), allocator_), allocator_);
    Value tool_call(kObjectType);
    tool_call.AddMember("function", function, allocator_);
    tool_call.AddMember("id", copy(*member(item, "call_id"), allocator_), allocator_);
    tool_call.AddMember("type", "function", allocator_);
    if (merge_prev) {
      Value& prev = last_message();
      Value* tool_calls = member(prev, "tool_calls");
      if (!tool_calls || !tool_calls->IsArray())
        tool_calls = &set_member(prev, "tool_calls", Value(kArrayType), allocator_);
      tool_calls->PushBack(tool_call, allocator_);
      return;
    }
    Value tool_calls(kArrayType);
    tool_calls.PushBack(tool_call, allocator_);
    Value message(kObjectType);
    message.AddMember("role", "assistant", allocator_);
    message.AddMember("tool_calls", tool_calls, allocator_);
    messages_.PushBack(message, allocator_);
  }

  bool add_function_call_output(const Value& item) {
    Value content = copy(*member(item, "output"), allocator_);
    if (content.IsArray()) {
      for (Value& part : content.GetArray()) {
        if (!member_is(part, "type", "input_text"))
          return fail(ret_error_, "Output of tool call should be 'Input text'");
        set_member(part, "type", Value("text"), allocator_);
      }
    }
    Value message(kObjectType);
    message.AddMember("content", content, allocator_);
    message.AddMember("role", "tool", allocator_);
    message.AddMember("tool_call_id", copy(*member(item, "call_id"), allocator_), allocator_);
    messages_.PushBack(message, allocator_);
    return true;
  }

  bool add_reasoning(const Value& item, bool merge_prev) {
    const Value* content = member(item, "content");
    if (!content || !content->IsArray()) return fail(ret_error_, "item['content'] is not an array");
    if (content->Empty()) return fail(ret_error_, "item['content'] is empty");
    if (!has_string((*content)[0], "text"))
      return fail(ret_error_, "item['content']['text'] is not a string");
    Value text = copy(*member((*content)[0], "text"), allocator_);
    if (merge_prev) {
      set_member(last_message(), "reasoning_content", std::move(text), allocator_);
      return true;
    }
    Value message(kObjectType);
    message.AddMember("role", "assistant", allocator_);
    message.AddMember("content", Value(kArrayType), allocator_);
    message.AddMember("reasoning_content", text, allocator_);
    messages_.PushBack(message, allocator_);
    return true;
  }

  // The item itself, less its Responses-only members, with its content converted.
  void push_message(Value& item, Value parts) {
    erase_members(item, "type");
    erase_members(item, "status");
    set_member(item, "content", std::move(parts), allocator_);
    messages_.PushBack(item, allocator_);
  }

  void push_role_message(const char* role, Value content) {
    Value message(kObjectType);
    message.AddMember("role", rapidjson::StringRef(role), allocator_);
    message.AddMember("content", content, allocator_);
    messages_.PushBack(message, allocator_);
  }

  Value& last_message() { return messages_[messages_.Size() - 1]; }

  Allocator& allocator_;
  std::string* ret_error_;
  Value messages_{kArrayType};
};

// Function tools as chat tools ("strict" defaulting to true); the rest have no Chat
// Completions equivalent and are dropped, as llama-server does.
bool convert_tools(const Value& body, Value& chat, Allocator& allocator, std::string* ret_error) {
  const Value* tools = member(body, "tools");
  if (!tools) return true;
  if (!tools->IsArray()) return fail(ret_error, "'tools' must be an array of objects");
  Value chat_tools(kArrayType);
  for (const Value& tool : tools->GetArray()) {
    if (string_or_empty(tool, "type") != "function") continue;
    Value function = copy(tool, allocator);
    erase_members(function, "type");
    if (!member(function, "strict")) function.AddMember("strict", true, allocator);
    Value chat_tool(kObjectType);
    chat_tool.AddMember("type", "function", allocator);
    chat_tool.AddMember("function", function, allocator);
    chat_tools.PushBack(chat_tool, allocator);
  }
  erase_members(chat, "tools");
  if (!chat_tools.Empty()) chat.AddMember("tools", chat_tools, allocator);
  return true;
}

}  // namespace

bool responses_to_chat(const rapidjson::Value& body, rapidjson::Document& ret_chat,
                       std::string* ret_error) {
  if (!body.IsObject()) return fail(ret_error, "request body: expected a JSON object");
  const Value* input = member(body, "input");
  if (!input) return fail(ret_error, "'input' is required");
  if (!string_or_empty(body, "previous_response_id").empty())
    return fail(ret_error, "llama.cpp does not support 'previous_response_id'.");

  rapidjson::Document chat;
  Allocator& allocator = chat.GetAllocator();
  chat.CopyFrom(body, allocator);
  erase_members(chat, "input");
  MessageBuilder builder(allocator, ret_error);
  if (member(body, "instructions")) {
    builder.add_system(string_or_empty(body, "instructions"));
    erase_members(chat, "instructions");
  }
  if (!builder.add_input(*input)) return false;
  set_member(chat, "messages", builder.take_messages(), allocator);
  if (!convert_tools(body, chat, allocator, ret_error)) return false;

  if (const Value* max_output_tokens = member(body, "max_output_tokens")) {
    erase_members(chat, "max_output_tokens");
    set_member(chat, "max_tokens", copy(*max_output_tokens, allocator), allocator);
  }
  if (const Value* reasoning = member(body, "reasoning")) {
    // Only "effort" has a Chat Completions counterpart.
    if (const Value* effort = member(*reasoning, "effort"))
      set_member(chat, "reasoning_effort", copy(*effort, allocator), allocator);
    erase_members(chat, "reasoning");
  }
  ret_chat.Swap(chat);
  return true;
}

bool responses_usage(const rapidjson::Value& response, uint32_t* ret_input_tokens,
                     uint32_t* ret_cached_tokens) {
  const Value* usage = member(response, "usage");
  const Value* input_tokens = usage ? member(*usage, "input_tokens") : nullptr;
  if (!input_tokens || !input_tokens->IsUint()) return false;
  const Value* details = member(*usage, "input_tokens_details");
  const Value* cached_tokens = details ? member(*details, "cached_tokens") : nullptr;
  *ret_input_tokens = input_tokens->GetUint();
  *ret_cached_tokens = cached_tokens && cached_tokens->IsUint() ? cached_tokens->GetUint() : 0;
  return true;
}

void set_responses_cached_tokens(rapidjson::Value& response, uint32_t cached_tokens,
                                 rapidjson::Document::AllocatorType& allocator) {
  Value* usage = member(response, "usage");
  if (!usage || !usage->IsObject()) return;
  Value* details = member(*usage, "input_tokens_details");
  if (!details || !details->IsObject())
    details = &set_member(*usage, "input_tokens_details", Value(kObjectType), allocator);
  set_member(*details, "cached_tokens", Value(cached_tokens), allocator);
}

}  // namespace kvpark::proxy
