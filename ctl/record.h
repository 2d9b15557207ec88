// kvparkctl's records: one object of kvparkd's JSON schema (proto/json_schema.h,
// docs/operations.md), whichever way it was read — D-Bus a{sv} dictionaries are
// brought to the schema here, HTTP documents already are in it.
//
// Pure functions over plain values (no bus, no HTTP) so the schema rules can be
// read and tested on their own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvpark::ctl {

struct Value {
  enum class Kind : uint8_t { Number, Text, Flag };
  Kind kind = Kind::Number;
  uint64_t number = 0;
  std::string text;
  bool flag = false;

  static Value of_number(uint64_t n) { return {.kind = Kind::Number, .number = n}; }
  static Value of_text(std::string t) { return {.kind = Kind::Text, .text = std::move(t)}; }
  static Value of_flag(bool f) { return {.kind = Kind::Flag, .flag = f}; }
};

using Record = std::map<std::string, Value>;

// A number, or an identifier carried as a decimal string; 0 when absent.
uint64_t number_of(const Record& r, const char* key);
std::string text_of(const Record& r, const char* key);  // "" when absent or not text
bool flag_of(const Record& r, const char* key);

// Records as the daemon's D-Bus adapter sends them, brought to the JSON schema:
// 64-bit ids become strings (incarnation 16 hex digits, entry ids, sessions and
// flush jobs decimal), an entry's "key" is "key_hash".
Record status_from_dbus(Record r);
Record entry_from_dbus(Record r);
Record progress_from_dbus(Record r);

// `kvparkctl stats`: every figure of a status record (its numbers) and the
// incarnation, which identifies the figures' daemon.
Record stats_of(const Record& status);

// One JSON document, RFC 8259, keys in sorted order.
std::string json_of(const Value& v);
std::string json_of(const Record& r);
std::string json_of(const std::vector<Record>& list);

}  // namespace kvpark::ctl
