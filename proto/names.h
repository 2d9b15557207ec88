// How every door spells ids and enumerated values: the HTTP status API, D-Bus,
// kvparkctl, kvpark-proxy and the benches print and read them through here, so
// they cannot drift apart (docs/operations.md, "JSON").
//
// Printed forms: a 128-bit id is 32 lowercase hex digits, high word first (a 64-bit
// one, the incarnation, 16); an enumerated value is one snake_case word. Read forms: the printed ones, and for
// ids also what kvparkctl shows (leading zeros dropped) and a 0x prefix.
#pragma once

#include <string>
#include <string_view>

#include "proto/types.h"

namespace kvpark {

// 32 lowercase hex digits, high word first.
std::string hex128(const Hash128& value);
// 16 lowercase hex digits (the daemon's incarnation, json_schema.h).
std::string hex64(uint64_t value);
// 1 to 32 hex digits of either case, optionally after "0x", high word first;
// fewer than 32 fill from the low end ("5" is 0...05). False on anything else,
// ret_value untouched.
bool parse_hex128(std::string_view text, Hash128& ret_value);

const char* entry_kind_name(EntryKind kind);     // block, snapshot
const char* tier_name(Tier tier);                // host, disk, both
const char* entry_class_name(EntryClass value);  // shared, private
// default_automatic, requested_automatic, explicit_breakpoint, engine_structural,
// observed_recurrence
const char* evidence_name(Evidence evidence);
// root, shared_stable_prefix, private_turn_closure; "?" for a value out of range
// (a reply from a newer daemon).
const char* reuse_kind_name(ReuseKind kind);

// The inverse of tier_name and entry_class_name; false (ret_ untouched) for any
// other text.
bool parse_tier(std::string_view text, Tier& ret_tier);
bool parse_entry_class(std::string_view text, EntryClass& ret_class);

}  // namespace kvpark
