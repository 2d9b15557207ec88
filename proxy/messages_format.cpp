// The Anthropic Messages front door (wire_formats.h): requests converted to Chat Completions
// as llama-server converts them, answers and streams converted back, Anthropic error bodies.
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <climits>
#include <string_view>
#include <utility>
#include <vector>

#include "proxy/json.h"
#include "proxy/llama_json_text.h"
#include "proxy/wire_formats.h"

namespace kvpark::proxy {

namespace {

using rapidjson::Value;
using Allocator = rapidjson::Document::AllocatorType;
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

constexpr int max_tokens_default = 4096;               // tokens, when a request names none
constexpr int thinking_budget_tokens_default = 10000;  // tokens
constexpr size_t quoted_error_body_max = 512;          // bytes of an odd upstream body quoted
constexpr std::string_view billing_header_prefix = "x-anthropic-billing-header:";
constexpr std::string_view billing_stamp_key = "cch=";
constexpr size_t billing_stamp_length = 5;  // characters

// `name` of `object`; a null value when `object` is not an object or lacks it.
const Value& field(const Value& object, const char* name) {
  static const Value absent;
  if (!object.IsObject()) return absent;
  const auto it = object.FindMember(name);
  return it == object.MemberEnd() ? absent : it->value;
}

bool has(const Value& object, const char* name) {
  return object.IsObject() && object.HasMember(name);
}

std::string_view view_of(const Value& string) {
  return {string.GetString(), string.GetStringLength()};
}

// llama-server's json_value(object, name, fallback): the string there, else `fallback`.
std::string_view text_field(const Value& object, const char* name, std::string_view fallback = "") {
  const Value& v = field(object, name);
  return v.IsString() ? view_of(v) : fallback;
}

Value string_value(std::string_view s, Allocator& a) {
  return Value(s.data(), rapidjson::SizeType(s.size()), a);
}

// The values object() takes: a Value (moved), a copied string, or a literal (referenced).
Value member_value(Value&& v, Allocator&) { return std::move(v); }
Value member_value(std::string_view s, Allocator& a) { return string_value(s, a); }
Value member_value(const char* literal, Allocator&) { return Value(rapidjson::StringRef(literal)); }

void add_members(Value&, Allocator&) {}
template <typename V, typename... Rest>
void add_members(Value& object, Allocator& a, const char* key, V&& value, Rest&&... rest) {
  object.AddMember(rapidjson::StringRef(key), member_value(std::forward<V>(value), a), a);
  add_members(object, a, std::forward<Rest>(rest)...);
}

// An object of literal keys and values in order: object(a, "role", "tool", "content", v).
template <typename... Members>
Value object(Allocator& a, Members&&... members) {
  Value o(rapidjson::kObjectType);
  add_members(o, a, std::forward<Members>(members)...);
  return o;
}

// An Anthropic cache_control mark: an object, as the proxy's request parser requires.
bool has_mark(const Value& object) {
  return field(object, "cache_control").IsObject();
}

void add_mark(Value& marked, Allocator& a) {
  if (!marked.HasMember("cache_control"))
    marked.AddMember("cache_control", object(a, "type", "ephemeral"), a);
}

// Replaces the per-request stamp after "cch=" in a billing header, as llama-server does
// (normalize_anthropic_billing_header). Whether the text changed.
bool normalize_billing_stamp(std::string* text) {
  if (text->rfind(billing_header_prefix, 0) != 0) return false;
  const size_t key = text->find(billing_stamp_key, billing_header_prefix.size());
  if (key == std::string::npos) return false;
  const size_t stamp = key + billing_stamp_key.size();
  if (stamp + billing_stamp_length >= text->size() || (*text)[stamp + billing_stamp_length] != ';')
    return false;
  const std::string normal(billing_stamp_length, 'f');
  if (text->compare(stamp, billing_stamp_length, normal) == 0) return false;
  text->replace(stamp, billing_stamp_length, normal);
  return true;
}

// ---- Messages request -> Chat Completions request ---------------------------------------------

void add_system(const Value& body, bool normalize, Value& messages, int* normalized, Allocator& a) {
  const Value& system = field(body, "system");
  if (system.IsNull()) return;
  std::string content;
  bool marked = false;
  if (system.IsString()) {
    content = view_of(system);
    if (normalize && normalize_billing_stamp(&content)) ++*normalized;
  } else if (system.IsArray()) {
    for (const Value& block : system.GetArray()) {
      marked = marked || has_mark(block);
      if (text_field(block, "type") != "text") continue;
      std::string text(text_field(block, "text"));
      if (normalize && normalize_billing_stamp(&text)) ++*normalized;
      content += text;
    }
  }
  Value message = object(a, "role", "system", "content", content);
  if (marked) add_mark(message, a);
  messages.PushBack(message, a);
}

// An image block as an image_url part; false for a source llama-server skips.
bool image_part(const Value& block, Allocator& a, Value* ret_part) {
  const Value& source = field(block, "source");
  const std::string_view type = text_field(source, "type");
  std::string url;
  if (type == "base64") {
    url = "data:" + std::string(text_field(source, "media_type", "image/jpeg")) + ";base64," +
          std::string(text_field(source, "data"));
  } else if (type == "url") {
    url = text_field(source, "url");
  } else {
    return false;
  }
  *ret_part = object(a, "type", "image_url", "image_url", object(a, "url", url));
  return true;
}

Value tool_call(const Value& block, Allocator& a) {
  static const Value empty_object(rapidjson::kObjectType);
  const Value& input = field(block, "input");
  std::string arguments;
  dump_sorted(input.IsNull() ? empty_object : input, &arguments);
  return object(a, "id", text_field(block, "id"), "type", "function", "function",
                object(a, "name", text_field(block, "name"), "arguments", arguments));
}

// A tool_result block as a "tool" message: a string, text parts joined, or (with
// images) the parts themselves.
Value tool_message(const Value& block, Allocator& a) {
  const Value& result = field(block, "content");
  Value content;
  bool marked = has_mark(block);
  if (result.IsString()) {
    content = string_value(view_of(result), a);
  } else if (result.IsArray()) {
    std::string text;
    Value parts(rapidjson::kArrayType);
    bool has_images = false;
    for (const Value& c : result.GetArray()) {
      marked = marked || has_mark(c);
      const std::string_view type = text_field(c, "type");
      Value part;
      if (type == "text") {
        text += text_field(c, "text");
        parts.PushBack(object(a, "type", "text", "text", text_field(c, "text")), a);
      } else if (type == "image") {
        has_images = true;
        if (image_part(c, a, &part)) parts.PushBack(part, a);
      }
    }
    content = has_images ? std::move(parts) : string_value(text, a);
  } else {
    content.SetString("", a);
  }
  Value message = object(a, "role", "tool", "tool_call_id", text_field(block, "tool_use_id"),
                         "content", std::move(content));
  if (marked) add_mark(message, a);
  return message;
}

// One Anthropic message as the chat messages it becomes, appended to `messages`.
void add_message(const Value& msg, Value& messages, Allocator& a) {
  const std::string_view role = text_field(msg, "role");
  const Value& content = field(msg, "content");
  if (!has(msg, "content") || !content.IsArray()) {
    if (has(msg, "content") || role != "assistant") messages.PushBack(Value(msg, a), a);
    return;
  }
  Value parts(rapidjson::kArrayType), tool_calls(rapidjson::kArrayType);
  Value tool_results(rapidjson::kArrayType);
  std::string reasoning;
  bool block_marked = false;
  for (const Value& block : content.GetArray()) {
    const std::string_view type = text_field(block, "type");
    if (type == "tool_result") {
      tool_results.PushBack(tool_message(block, a), a);
      continue;
    }
    block_marked = block_marked || has_mark(block);
    Value part;
    if (type == "text") {
      parts.PushBack(Value(block, a), a);
    } else if (type == "thinking") {
      reasoning += text_field(block, "thinking");
    } else if (type == "image" && image_part(block, a, &part)) {
      parts.PushBack(part, a);
    } else if (type == "tool_use") {
      tool_calls.PushBack(tool_call(block, a), a);
    }
  }
  const rapidjson::SizeType first = messages.Size();
  const bool own_message = !parts.Empty() || !tool_calls.Empty() || !reasoning.empty();
  if (own_message) {
    if (parts.Empty()) parts.SetString("", a);
    Value message = object(a, "role", role, "content", std::move(parts));
    if (!tool_calls.Empty()) message.AddMember("tool_calls", tool_calls, a);
    if (!reasoning.empty()) message.AddMember("reasoning_content", string_value(reasoning, a), a);
    if (block_marked) add_mark(message, a);
    messages.PushBack(message, a);
  }
  for (Value& result : tool_results.GetArray()) messages.PushBack(result, a);
  // A mark on the message itself (or on a block that became no message) ends the
  // prefix at the last chat message it became.
  if ((has_mark(msg) || (block_marked && !own_message)) && messages.Size() > first) {
    add_mark(messages[messages.Size() - 1], a);
  }
}

Value chat_tool(const Value& tool, Allocator& a) {
  Value parameters(rapidjson::kObjectType);
  if (has(tool, "input_schema")) parameters.CopyFrom(tool["input_schema"], a);
  Value chat = object(a, "type", "function", "function",
                      object(a, "name", text_field(tool, "name"), "description",
                             text_field(tool, "description"), "parameters", std::move(parameters)));
  if (has_mark(tool)) add_mark(chat, a);
  return chat;
}

// json_value(thinking, "budget_tokens", 10000): a number (or boolean) as an int.
int budget_tokens(const Value& thinking) {
  const Value& v = field(thinking, "budget_tokens");
  if (v.IsBool()) return v.GetBool() ? 1 : 0;
  if (v.IsInt64()) return int(v.GetInt64());
  if (v.IsUint64()) return int(v.GetUint64());
  if (v.IsDouble()) return int(std::clamp(v.GetDouble(), double(INT_MIN), double(INT_MAX)));
  return thinking_budget_tokens_default;
}

void add_request_members(const Value& body, Value& chat, Allocator& a) {
  const Value& choice = field(body, "tool_choice");
  const std::string_view choice_type = text_field(choice, "type");
  if (choice.IsObject() && choice_type == "auto") {
    chat.AddMember("tool_choice", "auto", a);
  } else if (choice.IsObject() && (choice_type == "any" || choice_type == "tool")) {
    chat.AddMember("tool_choice", "required", a);
  }
  if (has(body, "stop_sequences")) chat.AddMember("stop", Value(body["stop_sequences"], a), a);
  if (has(body, "max_tokens")) {
    chat.AddMember("max_tokens", Value(body["max_tokens"], a), a);
  } else {
    chat.AddMember("max_tokens", max_tokens_default, a);
  }
  for (const char* key : {"temperature", "top_p", "top_k", "stream", "chat_template_kwargs"}) {
    if (has(body, key)) chat.AddMember(rapidjson::StringRef(key), Value(body[key], a), a);
  }
  const Value& thinking = field(body, "thinking");
  if (text_field(thinking, "type") == "enabled") {
    chat.AddMember("thinking_budget_tokens", budget_tokens(thinking), a);
  }
  const std::string_view user_id = text_field(field(body, "metadata"), "user_id");
  if (!user_id.empty()) chat.AddMember("__metadata_user_id", string_value(user_id, a), a);
}

// ---- Chat Completions answers -> Messages answers ---------------------------------------------

// llama-server's stop_reason for a finish_reason.
const char* stop_reason_for(std::string_view finish_reason, bool tool_calls) {
  if (finish_reason == "stop") return tool_calls ? "tool_use" : "end_turn";
  if (finish_reason == "tool_calls") return "tool_use";
  return "max_tokens";
}

// RapidJSON's Writer, one member a call: out.open().str("type", "x").num("index", 0).close().
class JsonOut {
 public:
  JsonOut& open(const char* key = nullptr) { named(key).StartObject(); return *this; }
  JsonOut& close() { w_.EndObject(); return *this; }
  JsonOut& open_array(const char* key) { named(key).StartArray(); return *this; }
  JsonOut& close_array() { w_.EndArray(); return *this; }
  JsonOut& str(const char* key, std::string_view value) {
    named(key).String(value.data(), rapidjson::SizeType(value.size()));
    return *this;
  }
  JsonOut& num(const char* key, int64_t value) { named(key).Int64(value); return *this; }
  JsonOut& null(const char* key) { named(key).Null(); return *this; }
  JsonOut& value(const char* key, const Value& value) { value.Accept(named(key)); return *this; }
  std::string text() const { return std::string(buffer_.GetString(), buffer_.GetSize()); }

 private:
  JsonWriter& named(const char* key) {  // the next value's key, inside an object
    if (key != nullptr) w_.Key(key);
    return w_;
  }
  rapidjson::StringBuffer buffer_;
  JsonWriter w_{buffer_};
};

JsonOut& usage_member(JsonOut& out, const MessagesUsage& usage) {
  return out.open("usage")
      .num("input_tokens", usage.input_tokens)
      .num("cache_creation_input_tokens", usage.cache_creation_input_tokens)
      .num("cache_read_input_tokens", usage.cache_read_input_tokens)
      .num("output_tokens", usage.output_tokens)
      .close();
}

// A tool call's arguments parsed, as llama-server's answer carries them; {} when they
// are not JSON.
JsonOut& input_member(JsonOut& out, std::string_view arguments) {
  rapidjson::Document input;
  if (parse_json(arguments, input) != JsonStatus::ok) input.SetObject();
  return out.value("input", input);
}

// One server-sent event: its name is its data's "type".
std::string event(const char* type, JsonOut& data) {
  return std::string("event: ") + type + "\ndata: " + data.close().text() + "\n\n";
}

// An event's data with its "type", open for the rest of its members.
JsonOut& event_data(JsonOut& out, const char* type) {
  return out.open().str("type", type);
}

std::string block_delta(int index, const char* type, const char* key, std::string_view text) {
  JsonOut out;
  event_data(out, "content_block_delta").num("index", index);
  out.open("delta").str("type", type).str(key, text).close();
  return event("content_block_delta", out);
}

}  // namespace

const char* api_string(Api api) {
  switch (api) {
    case Api::chat_completions: return "chat_completions";
    case Api::responses: return "responses";
    case Api::messages: return "messages";
    case Api::count: break;
  }
  return "?";
}

bool messages_to_chat(const Value& body, bool normalize_billing_header,
                      rapidjson::Document& ret_chat, int* ret_normalized, std::string* ret_error) {
  const auto fail = [&](const char* reason) {
    if (ret_error != nullptr) *ret_error = reason;
    return false;
  };
  if (!body.IsObject()) return fail("request body: expected a JSON object");
  if (!body.HasMember("messages")) return fail("'messages' is required");
  rapidjson::Document chat;
  Allocator& a = chat.GetAllocator();
  chat.SetObject();
  Value messages(rapidjson::kArrayType);
  int normalized = 0;
  add_system(body, normalize_billing_header, messages, &normalized, a);
  if (body["messages"].IsArray()) {
    for (const Value& msg : body["messages"].GetArray()) add_message(msg, messages, a);
  }
  chat.AddMember("messages", messages, a);
  if (field(body, "tools").IsArray()) {
    Value tools(rapidjson::kArrayType);
    for (const Value& tool : body["tools"].GetArray()) tools.PushBack(chat_tool(tool, a), a);
    chat.AddMember("tools", tools, a);
  }
  add_request_members(body, chat, a);
  ret_chat.Swap(chat);
  if (ret_normalized != nullptr) *ret_normalized = normalized;
  return true;
}

std::vector<std::string> messages_ignored_fields(const Value& body) {
  // What the converter reads ("model" routes the request).
  static constexpr std::string_view read[] = {
      "model",       "system",      "messages", "tools",  "tool_choice",          "stop_sequences",
      "max_tokens",  "temperature", "top_p",    "top_k",  "chat_template_kwargs", "stream",
      "thinking",    "metadata"};
  std::vector<std::string> ignored;
  if (!body.IsObject()) return ignored;
  for (const auto& m : body.GetObject()) {
    if (std::find(std::begin(read), std::end(read), view_of(m.name)) == std::end(read))
      ignored.emplace_back(view_of(m.name));
  }
  return ignored;
}

bool chat_answer_to_message(const Value& chat, const MessagesUsage& usage, std::string* ret_body) {
  const Value& choices = field(chat, "choices");
  if (!choices.IsArray() || choices.Empty()) return false;
  const Value& message = field(choices[0], "message");
  if (!message.IsObject()) return false;
  const Value& tool_calls = field(message, "tool_calls");
  const bool has_tool_calls = tool_calls.IsArray() && !tool_calls.Empty();
  JsonOut out;
  out.open().str("id", text_field(chat, "id")).str("type", "message").str("role", "assistant");
  out.open_array("content");
  const std::string_view thinking = text_field(message, "reasoning_content");
  if (!thinking.empty()) {  // a local model signs nothing: the signature is empty
    out.open().str("type", "thinking").str("thinking", thinking).str("signature", "").close();
  }
  if (const std::string_view text = text_field(message, "content"); !text.empty()) {
    out.open().str("type", "text").str("text", text).close();
  }
  for (rapidjson::SizeType i = 0; has_tool_calls && i < tool_calls.Size(); ++i) {
    const Value& function = field(tool_calls[i], "function");
    out.open().str("type", "tool_use").str("id", text_field(tool_calls[i], "id"));
    out.str("name", text_field(function, "name"));
    input_member(out, text_field(function, "arguments")).close();
  }
  out.close_array().str("model", text_field(chat, "model"));
  out.str("stop_reason", stop_reason_for(text_field(choices[0], "finish_reason"), has_tool_calls));
  usage_member(out.null("stop_sequence"), usage).close();
  *ret_body = out.text();
  return true;
}

// ---- MessagesStream ---------------------------------------------------------------------------

std::string MessagesStream::start_message(const Value& chunk) {
  started_ = true;
  JsonOut out;
  event_data(out, "message_start").open("message");
  out.str("id", text_field(chunk, "id")).str("type", "message").str("role", "assistant");
  out.open_array("content").close_array().str("model", text_field(chunk, "model"));
  out.null("stop_reason").null("stop_sequence");
  out.open("usage").num("input_tokens", 0).num("output_tokens", 0).close().close();
  return event("message_start", out);
}

std::string MessagesStream::stop_block() {
  if (open_ == Block::none) return "";
  const int index = next_index_ - 1;
  std::string events;
  if (open_ == Block::thinking) events += block_delta(index, "signature_delta", "signature", "");
  JsonOut out;
  event_data(out, "content_block_stop").num("index", index);
  open_ = Block::none;
  open_tool_ = -1;
  return events + event("content_block_stop", out);
}

std::string MessagesStream::on_chunk(const Value& chunk) {
  const Value& choices = field(chunk, "choices");
  if (finished_ || !choices.IsArray() || choices.Empty()) return "";
  std::string events = started_ ? "" : start_message(chunk);
  // Stops the open block and starts `block`, unless it is the one open; `content_block`
  // writes the start event's content_block members.
  const auto open = [&](Block block, int tool, const auto& content_block) {
    if (open_ == block && open_tool_ == tool) return;
    events += stop_block();
    JsonOut out;
    event_data(out, "content_block_start").num("index", next_index_).open("content_block");
    content_block(out).close();
    events += event("content_block_start", out);
    open_ = block;
    open_tool_ = tool;
    ++next_index_;
  };
  const Value& delta = field(choices[0], "delta");
  if (const std::string_view thinking = text_field(delta, "reasoning_content"); !thinking.empty()) {
    open(Block::thinking, -1,
         [](JsonOut& out) -> JsonOut& { return out.str("type", "thinking").str("thinking", ""); });
    events += block_delta(next_index_ - 1, "thinking_delta", "thinking", thinking);
  }
  if (const std::string_view text = text_field(delta, "content"); !text.empty()) {
    open(Block::text, -1,
         [](JsonOut& out) -> JsonOut& { return out.str("type", "text").str("text", ""); });
    events += block_delta(next_index_ - 1, "text_delta", "text", text);
  }
  const Value& tool_calls = field(delta, "tool_calls");
  for (rapidjson::SizeType i = 0; tool_calls.IsArray() && i < tool_calls.Size(); ++i) {
    const Value& call = tool_calls[i];
    const Value& function = field(call, "function");
    tool_calls_seen_ = true;
    open(Block::tool_use, field(call, "index").IsInt() ? call["index"].GetInt() : 0,
         [&](JsonOut& out) -> JsonOut& {
           out.str("type", "tool_use").str("id", text_field(call, "id"));
           return out.str("name", text_field(function, "name")).open("input").close();
         });
    const std::string_view arguments = text_field(function, "arguments");
    if (!arguments.empty()) {
      events += block_delta(next_index_ - 1, "input_json_delta", "partial_json", arguments);
    }
  }
  const Value& finish_reason = field(choices[0], "finish_reason");
  if (finish_reason.IsString()) stop_reason_ = stop_reason_for(view_of(finish_reason), false);
  return events;
}

std::string MessagesStream::finish(const MessagesUsage& usage) {
  if (finished_) return "";
  finished_ = true;
  std::string events = started_ ? "" : start_message(Value(rapidjson::kObjectType));
  events += stop_block();
  if (stop_reason_ == "end_turn" && tool_calls_seen_) stop_reason_ = "tool_use";
  JsonOut delta, stop;
  event_data(delta, "message_delta").open("delta").str("stop_reason", stop_reason_);
  usage_member(delta.null("stop_sequence").close(), usage);
  event_data(stop, "message_stop");
  return events + event("message_delta", delta) + event("message_stop", stop);
}

// ---- Errors -----------------------------------------------------------------------------------

std::string messages_error_body(const std::string& type, const std::string& message) {
  JsonOut out;
  out.open().str("type", "error").open("error").str("type", type).str("message", message);
  return out.close().close().text();
}

const char* messages_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return "api_error";
  }
}

std::string messages_error_from_openai(int status, const std::string& openai_body) {
  rapidjson::Document doc;
  if (parse_json(openai_body, doc) == JsonStatus::ok) {
    const Value& message = field(field(doc, "error"), "message");
    if (message.IsString()) {
      return messages_error_body(messages_error_type(status), std::string(view_of(message)));
    }
  }
  size_t quoted = std::min(openai_body.size(), quoted_error_body_max);
  while (quoted > 0 && quoted < openai_body.size() && (openai_body[quoted] & 0xC0) == 0x80)
    --quoted;  // not inside a UTF-8 character
  return messages_error_body("api_error", "upstream answered HTTP " + std::to_string(status) +
                                              ": " + openai_body.substr(0, quoted));
}

}  // namespace kvpark::proxy
