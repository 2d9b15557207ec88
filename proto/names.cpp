// Ids and enumerated values as every door spells them (see names.h).
#include "proto/names.h"

#include <cinttypes>
#include <cstdio>

namespace kvpark {
namespace {

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string hex128(const Hash128& value) {
  char text[33];
  snprintf(text, sizeof text, "%016" PRIx64 "%016" PRIx64, value.high, value.low);
  return text;
}

std::string hex64(uint64_t value) {
  char text[17];
  snprintf(text, sizeof text, "%016" PRIx64, value);
  return text;
}

bool parse_hex128(std::string_view text, Hash128& ret_value) {
  if (text.substr(0, 2) == "0x") text.remove_prefix(2);
  if (text.empty() || text.size() > 32) return false;
  Hash128 value;
  for (char c : text) {
    const int digit = hex_digit_value(c);
    if (digit < 0) return false;
    value.high = (value.high << 4) | (value.low >> 60);
    value.low = (value.low << 4) | uint64_t(digit);
  }
  ret_value = value;
  return true;
}

const char* entry_kind_name(EntryKind kind) {
  return kind == EntryKind::Block ? "block" : "snapshot";
}

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::Host: return "host";
    case Tier::Disk: return "disk";
    case Tier::Both: return "both";
  }
  return "host";
}

const char* entry_class_name(EntryClass value) {
  return value == EntryClass::Shared ? "shared" : "private";
}

const char* evidence_name(Evidence evidence) {
  switch (evidence) {
    case Evidence::DefaultAutomatic: return "default_automatic";
    case Evidence::RequestedAutomatic: return "requested_automatic";
    case Evidence::ExplicitBreakpoint: return "explicit_breakpoint";
    case Evidence::EngineStructural: return "engine_structural";
    case Evidence::ObservedRecurrence: return "observed_recurrence";
  }
  return "default_automatic";
}

const char* reuse_kind_name(ReuseKind kind) {
  switch (kind) {
    case ReuseKind::Root: return "root";
    case ReuseKind::SharedStablePrefix: return "shared_stable_prefix";
    case ReuseKind::PrivateTurnClosure: return "private_turn_closure";
  }
  return "?";
}

bool parse_tier(std::string_view text, Tier& ret_tier) {
  for (Tier t : {Tier::Host, Tier::Disk, Tier::Both}) {
    if (text == tier_name(t)) {
      ret_tier = t;
      return true;
    }
  }
  return false;
}

bool parse_entry_class(std::string_view text, EntryClass& ret_class) {
  for (EntryClass c : {EntryClass::Shared, EntryClass::Private}) {
    if (text == entry_class_name(c)) {
      ret_class = c;
      return true;
    }
  }
  return false;
}

}  // namespace kvpark
