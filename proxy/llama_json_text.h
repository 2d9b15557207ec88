// JSON text as llama-server writes it: nlohmann::json's dump(), compact, object keys
// in byte order (a std::map: of duplicate keys the last wins), its string escapes and
// number format. llama-server writes an Anthropic tool_use "input" so into the tool
// call's arguments, which its template renders: the proxy must write the same bytes to
// render the same tokens.
#pragma once

#include <rapidjson/document.h>

#include <string>

namespace kvpark::proxy {

// Appends `v` to *out as nlohmann::json's dump() writes it.
void dump_sorted(const rapidjson::Value& v, std::string* out);

}  // namespace kvpark::proxy
