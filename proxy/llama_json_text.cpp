// nlohmann::json's dump() (llama_json_text.h), written over RapidJSON values.
#include "proxy/llama_json_text.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

namespace kvpark::proxy {
namespace {

using rapidjson::Value;

// nlohmann::json writes a double's digits in fixed notation for decimal exponents from
// just above this minimum to its maximum (std::numeric_limits<double>::digits10).
constexpr int nlohmann_fixed_exponent_min = -4;
constexpr int nlohmann_fixed_exponent_max = 15;

std::string_view view_of(const Value& string) {
  return {string.GetString(), string.GetStringLength()};
}

void dump_string(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          *out += escaped;
        } else {
          out->push_back(char(c));
        }
    }
  }
  out->push_back('"');
}

// The shortest round-trip digits, placed as nlohmann's to_chars places them: "1.0",
// "0.001", "1e+20", "1.5e-07".
void dump_double(double v, std::string* out) {
  if (std::signbit(v)) {
    out->push_back('-');
    v = -v;
  }
  if (v == 0) {
    *out += "0.0";
    return;
  }
  char buffer[32];
  const std::string_view sci(  // d.ddde±XX
      buffer, std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::scientific).ptr);
  const size_t e = sci.find('e');
  std::string digits(1, sci[0]);
  if (e > 1) digits += sci.substr(2, e - 2);
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  const int k = int(digits.size());
  const int n = exponent + 1;  // the decimal point's place among the digits
  if (k <= n && n <= nlohmann_fixed_exponent_max) {
    *out += digits + std::string(size_t(n - k), '0') + ".0";
  } else if (0 < n && n <= nlohmann_fixed_exponent_max) {
    *out += digits.substr(0, size_t(n)) + "." + digits.substr(size_t(n));
  } else if (nlohmann_fixed_exponent_min < n && n <= 0) {
    *out += "0." + std::string(size_t(-n), '0') + digits;
  } else {
    *out += k == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", n - 1 < 0 ? '-' : '+', std::abs(n - 1));
    *out += exp;
  }
}

}  // namespace

void dump_sorted(const Value& v, std::string* out) {
  if (v.IsObject()) {
    std::vector<const Value::Member*> members;
    for (const auto& m : v.GetObject()) members.push_back(&m);
    std::stable_sort(members.begin(), members.end(), [](const auto* x, const auto* y) {
      return view_of(x->name) < view_of(y->name);
    });
    out->push_back('{');
    bool first = true;
    for (size_t i = 0; i < members.size(); ++i) {
      if (i + 1 < members.size() && view_of(members[i]->name) == view_of(members[i + 1]->name))
        continue;
      if (!first) out->push_back(',');
      first = false;
      dump_string(view_of(members[i]->name), out);
      out->push_back(':');
      dump_sorted(members[i]->value, out);
    }
    out->push_back('}');
  } else if (v.IsArray()) {
    out->push_back('[');
    for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
      if (i > 0) out->push_back(',');
      dump_sorted(v[i], out);
    }
    out->push_back(']');
  } else if (v.IsString()) {
    dump_string(view_of(v), out);
  } else if (v.IsInt64()) {
    *out += std::to_string(v.GetInt64());
  } else if (v.IsUint64()) {
    *out += std::to_string(v.GetUint64());
  } else if (v.IsDouble()) {
    dump_double(v.GetDouble(), out);
  } else {
    *out += v.IsNull() ? "null" : v.IsTrue() ? "true" : "false";
  }
}


}  // namespace kvpark::proxy
