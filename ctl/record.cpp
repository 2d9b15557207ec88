// kvparkctl's records and their JSON (see record.h).
#include "ctl/record.h"

#include <charconv>

#include "ctl/format.h"
#include "proto/json_schema.h"
#include "proto/names.h"

namespace kvpark::ctl {
namespace {

void to_decimal_text(Record& r, const char* key) {
  auto it = r.find(key);
  if (it != r.end() && it->second.kind == Value::Kind::Number) {
    it->second = Value::of_text(std::to_string(it->second.number));
  }
}

}  // namespace

uint64_t number_of(const Record& r, const char* key) {
  auto it = r.find(key);
  if (it == r.end()) return 0;
  if (it->second.kind == Value::Kind::Number) return it->second.number;
  if (it->second.kind == Value::Kind::Text) {
    const std::string& t = it->second.text;
    uint64_t value = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
    if (ec == std::errc() && end == t.data() + t.size()) return value;
  }
  return 0;
}

std::string text_of(const Record& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->second.kind == Value::Kind::Text ? it->second.text : std::string();
}

bool flag_of(const Record& r, const char* key) {
  auto it = r.find(key);
  return it != r.end() && it->second.kind == Value::Kind::Flag && it->second.flag;
}

Record status_from_dbus(Record r) {
  auto it = r.find(json_schema::incarnation);
  if (it != r.end() && it->second.kind == Value::Kind::Number) {
    it->second = Value::of_text(hex64(it->second.number));
  }
  return r;
}

Record entry_from_dbus(Record r) {
  to_decimal_text(r, json_schema::entry_id);
  to_decimal_text(r, json_schema::creator_session);
  if (auto it = r.find("key"); it != r.end()) {  // D-Bus Park1 names it "key"
    r[json_schema::key_hash] = it->second;
    r.erase("key");
  }
  return r;
}

Record progress_from_dbus(Record r) {
  to_decimal_text(r, json_schema::flush_job);
  return r;
}

Record stats_of(const Record& status) {
  Record out;
  for (const auto& [key, value] : status) {
    if (value.kind == Value::Kind::Number || key == json_schema::incarnation) out[key] = value;
  }
  return out;
}

std::string json_of(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Number:
      return std::to_string(v.number);
    case Value::Kind::Text:
      return json_quote(v.text);
    case Value::Kind::Flag:
      return v.flag ? "true" : "false";
  }
  return "null";
}

std::string json_of(const Record& r) {
  std::string out = "{";
  for (const auto& [key, value] : r) {
    if (out.size() > 1) out += ",";
    out += json_quote(key) + ":" + json_of(value);
  }
  return out + "}";
}

std::string json_of(const std::vector<Record>& list) {
  std::string out = "[";
  for (const Record& r : list) out += (out.size() > 1 ? "," : "") + json_of(r);
  return out + "]";
}

}  // namespace kvpark::ctl
