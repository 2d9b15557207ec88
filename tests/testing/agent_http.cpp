// Responses and Messages requests as the official SDKs shape them, and their answers
// read back: whole, or streamed as server-sent events.
#include "tests/testing/agent_http.h"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <chrono>

namespace kvpark::testing {
namespace {

using Clock = std::chrono::steady_clock;
using Writer = rapidjson::Writer<rapidjson::StringBuffer>;

double msec_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

void text_key(Writer& w, const char* key, const std::string& value) {
  w.Key(key);
  w.String(value.c_str(), rapidjson::SizeType(value.size()));
}

const rapidjson::Value* member(const rapidjson::Value& v, const char* name) {
  if (!v.IsObject()) return nullptr;
  const auto it = v.FindMember(name);
  return it == v.MemberEnd() ? nullptr : &it->value;
}

int64_t int_member(const rapidjson::Value* v, const char* name) {
  const rapidjson::Value* m = v != nullptr ? member(*v, name) : nullptr;
  return m != nullptr && m->IsInt64() ? m->GetInt64() : -1;
}

std::string string_member(const rapidjson::Value& v, const char* name) {
  const rapidjson::Value* m = member(v, name);
  return m != nullptr && m->IsString() ? m->GetString() : "";
}

// Codex-style input items: user messages with input_text, assistant output messages.
void write_responses(Writer& w, const AgentRequest& r) {
  text_key(w, "instructions", r.system);
  w.Key("input");
  w.StartArray();
  for (const ChatMessage& m : r.turns) {
    const bool user = m.role != "assistant";
    w.StartObject();
    text_key(w, "type", "message");
    text_key(w, "role", m.role);
    w.Key("content");
    w.StartArray();
    w.StartObject();
    text_key(w, "type", user ? "input_text" : "output_text");
    text_key(w, "text", m.content);
    w.EndObject();
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("max_output_tokens");
  w.Int(r.max_tokens);
  if (!r.cache_prompt) {
    w.Key("cache_prompt");
    w.Bool(false);
  }
}

// Claude-Code-style: system blocks (a billing line first), content blocks.
void write_messages(Writer& w, const AgentRequest& r) {
  w.Key("system");
  if (r.billing_cch.empty() && !r.mark_system) {
    w.String(r.system.c_str(), rapidjson::SizeType(r.system.size()));
  } else {
    w.StartArray();
    if (!r.billing_cch.empty()) {
      w.StartObject();
      text_key(w, "type", "text");
      text_key(w, "text", "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
                          "cch=" + r.billing_cch + ";");
      w.EndObject();
    }
    w.StartObject();
    text_key(w, "type", "text");
    text_key(w, "text", r.system);
    if (r.mark_system) {
      w.Key("cache_control");
      w.StartObject();
      text_key(w, "type", "ephemeral");
      w.EndObject();
    }
    w.EndObject();
    w.EndArray();
  }
  w.Key("messages");
  w.StartArray();
  for (const ChatMessage& m : r.turns) {
    w.StartObject();
    text_key(w, "role", m.role);
    w.Key("content");
    w.StartArray();
    w.StartObject();
    text_key(w, "type", "text");
    text_key(w, "text", m.content);
    w.EndObject();
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.Key("max_tokens");
  w.Int(r.max_tokens);
}

// The figures of a Responses object or a Messages message (or message_delta).
void read_usage(WireFormat format, const rapidjson::Value& usage, AgentResult* ret) {
  if (format == WireFormat::responses) {
    ret->prompt_tokens = int_member(&usage, "input_tokens");
    ret->cached_tokens = int_member(member(usage, "input_tokens_details"), "cached_tokens");
    return;
  }
  ret->input_tokens = int_member(&usage, "input_tokens");
  ret->cached_tokens = int_member(&usage, "cache_read_input_tokens");
  ret->cache_creation_tokens = int_member(&usage, "cache_creation_input_tokens");
  // llama-server's own /v1/messages reports no cache_creation_input_tokens.
  if (ret->input_tokens >= 0 && ret->cached_tokens >= 0)
    ret->prompt_tokens =
        ret->input_tokens + ret->cached_tokens + std::max<int64_t>(0, ret->cache_creation_tokens);
}

void read_whole(WireFormat format, const rapidjson::Document& doc, AgentResult* ret) {
  if (format == WireFormat::chat) {
    const rapidjson::Value* choices = member(doc, "choices");
    if (choices == nullptr || !choices->IsArray() || choices->Empty()) return;
    const rapidjson::Value* message = member((*choices)[0], "message");
    if (message != nullptr) ret->content = string_member(*message, "content");
    const rapidjson::Value* usage = member(doc, "usage");
    ret->prompt_tokens = int_member(usage, "prompt_tokens");
    ret->cached_tokens =
        int_member(usage != nullptr ? member(*usage, "prompt_tokens_details") : nullptr,
                   "cached_tokens");
    ret->parsed = true;
    return;
  }
  const rapidjson::Value* parts =
      member(doc, format == WireFormat::responses ? "output" : "content");
  if (parts == nullptr || !parts->IsArray()) return;
  for (const auto& part : parts->GetArray()) {
    if (format == WireFormat::messages) {
      if (string_member(part, "type") == "text") ret->content += string_member(part, "text");
      continue;
    }
    const rapidjson::Value* content = member(part, "content");
    if (string_member(part, "type") != "message" || content == nullptr || !content->IsArray())
      continue;
    for (const auto& c : content->GetArray())
      if (string_member(c, "type") == "output_text") ret->content += string_member(c, "text");
  }
  if (const rapidjson::Value* usage = member(doc, "usage")) read_usage(format, *usage, ret);
  ret->parsed = true;
}

void read_error(const rapidjson::Document& doc, AgentResult* ret) {
  const rapidjson::Value* error = member(doc, "error");
  if (error == nullptr) return;
  ret->error_type = string_member(*error, "type");
  ret->error_message = string_member(*error, "message");
}

// One streamed event's data.
void read_event(WireFormat format, const rapidjson::Document& data, Clock::time_point start,
                AgentResult* ret) {
  const std::string type = string_member(data, "type");
  std::string text;
  if (format == WireFormat::chat) {
    const rapidjson::Value* choices = member(data, "choices");
    if (choices != nullptr && choices->IsArray() && !choices->Empty())
      if (const rapidjson::Value* delta = member((*choices)[0], "delta"))
        text = string_member(*delta, "content");
    if (const rapidjson::Value* usage = member(data, "usage")) {
      ret->prompt_tokens = int_member(usage, "prompt_tokens");
      ret->cached_tokens = int_member(member(*usage, "prompt_tokens_details"), "cached_tokens");
      ret->parsed = ret->stream_closed = true;
    }
  } else if (format == WireFormat::responses) {
    if (type == "response.output_text.delta") text = string_member(data, "delta");
    if (type == "response.completed") {
      if (const rapidjson::Value* response = member(data, "response"))
        if (const rapidjson::Value* usage = member(*response, "usage"))
          read_usage(format, *usage, ret);
      ret->parsed = ret->stream_closed = true;
    }
  } else {
    if (type == "content_block_delta")
      if (const rapidjson::Value* delta = member(data, "delta"))
        if (string_member(*delta, "type") == "text_delta") text = string_member(*delta, "text");
    if (type == "message_delta")
      if (const rapidjson::Value* usage = member(data, "usage")) read_usage(format, *usage, ret);
    if (type == "message_stop") ret->parsed = ret->stream_closed = true;
  }
  if (!text.empty() && ret->first_content_msec < 0) ret->first_content_msec = msec_since(start);
  ret->content += text;
}

void drain_events(WireFormat format, std::string* pending, Clock::time_point start,
                  AgentResult* ret) {
  for (size_t end; (end = pending->find("\n\n")) != std::string::npos;) {
    const std::string event = pending->substr(0, end);
    pending->erase(0, end + 2);
    const size_t at = event.rfind("data: ", 0) == 0 ? 0 : event.find("\ndata: ");
    if (at == std::string::npos) continue;
    const size_t begin = at == 0 ? 6 : at + 7;
    const size_t line_end = event.find('\n', begin);
    const std::string json = event.substr(begin, line_end == std::string::npos
                                                     ? std::string::npos
                                                     : line_end - begin);
    rapidjson::Document data;
    if (json == "[DONE]" || data.Parse(json.c_str()).HasParseError()) continue;
    read_event(format, data, start, ret);
  }
}

}  // namespace

const char* wire_format_string(WireFormat format) {
  switch (format) {
    case WireFormat::chat: return "chat";
    case WireFormat::responses: return "responses";
    case WireFormat::messages: return "messages";
  }
  return "?";
}

const char* agent_request_path(WireFormat format) {
  switch (format) {
    case WireFormat::chat: return "/v1/chat/completions";
    case WireFormat::responses: return "/v1/responses";
    case WireFormat::messages: return "/v1/messages";
  }
  return "/";
}

std::string agent_request_json(const AgentRequest& request) {
  if (request.format == WireFormat::chat) {
    ChatRequest chat{.model = request.model, .stream = request.stream,
                     .max_tokens = request.max_tokens, .cache_prompt = request.cache_prompt};
    chat.messages.push_back({"system", request.system});
    chat.messages.insert(chat.messages.end(), request.turns.begin(), request.turns.end());
    return chat_request_json(chat);
  }
  rapidjson::StringBuffer buffer;
  Writer w(buffer);
  w.StartObject();
  text_key(w, "model", request.model);
  if (request.format == WireFormat::responses)
    write_responses(w, request);
  else
    write_messages(w, request);
  w.Key("temperature");
  w.Double(0);
  w.Key("stream");
  w.Bool(request.stream);
  w.EndObject();
  return buffer.GetString();
}

int64_t AgentResult::header_int(const std::string& name_lower) const {
  const std::string value = http.header(name_lower);
  return value.empty() ? -1 : std::strtoll(value.c_str(), nullptr, 10);
}

AgentResult post_agent(const std::string& base_url, const AgentRequest& request,
                       int timeout_msec) {
  const std::string body = agent_request_json(request);
  const char* path = agent_request_path(request.format);
  AgentResult ret;
  const Clock::time_point start = Clock::now();
  if (!request.stream) {
    ret.http = http_post(base_url, path, body, "application/json", timeout_msec);
    ret.total_msec = msec_since(start);
    rapidjson::Document doc;
    doc.Parse(ret.http.body.c_str(), ret.http.body.size());
    if (ret.http.status == 0 || doc.HasParseError() || !doc.IsObject()) return ret;
    if (ret.http.status == 200)
      read_whole(request.format, doc, &ret);
    else
      read_error(doc, &ret);
    return ret;
  }
  std::string pending;
  ret.http = http_post_streamed(
      base_url, path, body,
      [&](const char* data, size_t length) {
        pending.append(data, length);
        drain_events(request.format, &pending, start, &ret);
      },
      timeout_msec);
  pending += "\n\n";
  drain_events(request.format, &pending, start, &ret);
  ret.total_msec = msec_since(start);
  return ret;
}

}  // namespace kvpark::testing
