// The JSON shape of kvparkd's records, shared by the HTTP status API
// (daemon/http_adapter.cpp) and `kvparkctl --json` (ctl/record.cpp); the
// documents are listed in docs/operations.md.
//
// Most JSON readers (jq, JavaScript, Python with parse_int=float) hold numbers
// as doubles, exact only up to 2^53. Byte counts and counters stay numbers (a
// machine does not reach 8 PiB); every 64-bit identifier travels as a string.
#pragma once

#include <cstdint>

namespace kvpark::json_schema {

// Largest integer every JSON reader holds exactly (a double's 53-bit mantissa).
inline constexpr uint64_t exact_integer_max = 1ull << 53;

// String-encoded identifiers, by key.
inline constexpr const char* incarnation = "incarnation";          // 16 hex digits
inline constexpr const char* entry_id = "id";                      // decimal digits (entries)
inline constexpr const char* creator_session = "creator_session";  // decimal digits
inline constexpr const char* flush_job = "job";                    // decimal digits
inline constexpr const char* key_hash = "key_hash";                // 32 hex digits, high word first
// Namespace ids ("id" of a namespace, "namespace" of an entry): 32 hex digits.

}  // namespace kvpark::json_schema
