#include "proxy/json.h"

#include <rapidjson/error/en.h>

namespace kvpark::proxy {

bool json_depth_within(std::string_view text, size_t depth_max) {
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character neither ends the string nor escapes
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > depth_max) return false;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return true;
}

JsonStatus parse_json(std::string_view text, rapidjson::Document& doc) {
  if (!json_depth_within(text, json_depth_max)) return JsonStatus::too_deep;
  // Full precision: numbers a request carries (tool arguments) are written back as read.
  doc.Parse<rapidjson::kParseIterativeFlag | rapidjson::kParseFullPrecisionFlag>(text.data(),
                                                                                 text.size());
  return doc.HasParseError() ? JsonStatus::invalid : JsonStatus::ok;
}

std::string json_error_string(JsonStatus status, const rapidjson::Document& doc) {
  switch (status) {
    case JsonStatus::ok:
      return "";
    case JsonStatus::invalid:
      return std::string("not valid JSON: ") + rapidjson::GetParseError_En(doc.GetParseError()) +
             " (at byte " + std::to_string(doc.GetErrorOffset()) + ")";
    case JsonStatus::too_deep:
      return "arrays or objects nested more than " + std::to_string(json_depth_max) +
             " levels deep";
  }
  return "?";
}

}  // namespace kvpark::proxy
