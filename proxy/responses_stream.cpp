// llama-server's streamed Responses events completed for the official SDKs
// (ResponsesStream, wire_formats.h).
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <string_view>

#include "proxy/wire_formats.h"

namespace kvpark::proxy {
namespace {

using rapidjson::Value;
using Allocator = rapidjson::Document::AllocatorType;

std::string_view string_at(const Value& object, const char* name) {
  if (!object.IsObject()) return {};
  const auto it = object.FindMember(name);
  if (it == object.MemberEnd() || !it->value.IsString()) return {};
  return {it->value.GetString(), it->value.GetStringLength()};
}

// Sets `name` unless the event has it already (a later llama-server may write it).
void add_if_absent(Value& object, const char* name, Value value, Allocator& a) {
  if (!object.HasMember(name)) object.AddMember(rapidjson::StringRef(name), value, a);
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string serialized_event(const Value& data) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  data.Accept(w);
  return "event: " + std::string(string_at(data, "type")) + "\ndata: " +
         std::string(buffer.GetString(), buffer.GetSize()) + "\n\n";
}

}  // namespace

std::string ResponsesStream::complete(rapidjson::Document& data) {
  if (!data.IsObject()) return "";
  Allocator& a = data.GetAllocator();
  const std::string type(string_at(data, "type"));
  add_if_absent(data, "sequence_number", Value(next_sequence_++), a);
  if (type == "response.created" || type == "response.in_progress") {
    if (data.HasMember("response") && data["response"].IsObject())
      add_if_absent(data["response"], "output", Value(rapidjson::kArrayType), a);
    return "";
  }
  // The item an event is about: its own "item" (added, done) or its "item_id".
  const bool item_event = type == "response.output_item.added" ||
                          type == "response.output_item.done";
  const std::string id(item_event && data.HasMember("item") ? string_at(data["item"], "id")
                                                            : string_at(data, "item_id"));
  if (id.empty() && !item_event) return "";
  auto found = std::find(items_.begin(), items_.end(), id);
  if (found == items_.end()) {
    items_.push_back(id);
    found = items_.end() - 1;
  }
  const auto index = uint64_t(found - items_.begin());
  add_if_absent(data, "output_index", Value(index), a);
  if (!item_event && (starts_with(type, "response.content_part.") ||
                      starts_with(type, "response.output_text.") ||
                      starts_with(type, "response.reasoning_text.")))
    add_if_absent(data, "content_index", Value(0u), a);
  if (type != "response.output_item.added" || string_at(data["item"], "type") != "reasoning")
    return "";
  // The reasoning text arrives as deltas of a part llama-server never adds.
  rapidjson::Document part;
  Allocator& pa = part.GetAllocator();
  part.SetObject();
  part.AddMember("type", "response.content_part.added", pa);
  part.AddMember("item_id", Value(id.c_str(), rapidjson::SizeType(id.size()), pa), pa);
  part.AddMember("output_index", Value(index), pa);
  part.AddMember("content_index", Value(0u), pa);
  Value text_part(rapidjson::kObjectType);
  text_part.AddMember("type", "reasoning_text", pa);
  text_part.AddMember("text", "", pa);
  part.AddMember("part", text_part, pa);
  part.AddMember("sequence_number", Value(next_sequence_++), pa);
  return serialized_event(part);
}

}  // namespace kvpark::proxy
