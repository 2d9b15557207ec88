// Reading JSON the proxy did not write (client bodies, upstream replies) without
// recursion. RapidJSON's default parser recurses once per level of nesting, and so
// do CopyFrom, Accept (serialising) and any walk over a document: a body of a few
// hundred kilobytes of "[" overflows a thread's stack. parse_json() counts the
// nesting over the raw text first (no recursion), refuses anything deeper than
// json_depth_max, and parses the rest with the iterative parser; every document the
// proxy then copies, serialises or walks nests at most that deep.
#pragma once

#include <rapidjson/document.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace kvpark::proxy {

// Arrays and objects nested deeper than this are refused. Requests nest a few
// levels (tool schemas a few dozen); a level costs the recursive RapidJSON calls
// a few hundred bytes of stack, so this many stay far below a thread's stack.
inline constexpr size_t json_depth_max = 256;  // levels

enum class JsonStatus {
  ok,
  invalid,   // not JSON (the document holds RapidJSON's error and offset)
  too_deep,  // nests arrays or objects deeper than json_depth_max
};

// Whether `text` nests arrays and objects at most depth_max levels (`[[1]]`: 2),
// counted over the raw text: brackets inside strings do not count. Exact for JSON;
// for text that is not JSON, whatever the parser says next.
bool json_depth_within(std::string_view text, size_t depth_max);

// Parses `text` into `doc` (iteratively) unless it nests deeper than json_depth_max.
JsonStatus parse_json(std::string_view text, rapidjson::Document& doc);

// Why parse_json() refused `text` ("" for ok): for the error messages clients read.
std::string json_error_string(JsonStatus status, const rapidjson::Document& doc);

}  // namespace kvpark::proxy
