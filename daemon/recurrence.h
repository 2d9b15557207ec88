// Recurrence detection (DESIGN.md §5): when lookups from two sessions share a long
// prefix past what is restorable, the next lookup passing it is told to capture
// state there (capture_hint_tokens; evidence observed recurrence, class shared).
//
// The chunk hashes past each lookup's restorable prefix are remembered with the
// session that sent them, in a ring of limits::recurrence_chunks_max hashes (the
// oldest is forgotten first). A chunk another session sends again is recurring.
// Chain hashes make this role-blind: a shared head is found without knowing where
// the system prompt ends. Loop thread only.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/entry_table.h"

namespace kvpark::daemon {

// How far past the restorable prefix two sessions must agree before a capture hint.
inline constexpr uint32_t recurrence_tokens_min = 1024;

class Recurrence {
 public:
  explicit Recurrence(const EntryTable& table) : table_(table) {}

  // Notes the chunks of one lookup past restorable_tokens; returns the deepest
  // position at least recurrence_tokens_min past it where a recurring chunk ends
  // and no snapshot is parked or being written, or 0.
  uint32_t observe(NamespaceIndex ns, std::span<const Hash128> chunk_hashes, uint64_t session_id,
                   uint32_t restorable_tokens, uint32_t chain_tokens);

 private:
  struct Seen {
    uint64_t session_id = 0;
    bool recurring = false;  // seen from two sessions
  };

  const EntryTable& table_;
  std::unordered_map<Hash128, Seen, Hash128Hasher> seen_;  // by chunk hash
  std::vector<Hash128> order_;  // insertion order, for bounded forgetting
  size_t next_ = 0;             // the oldest, once order_ is full
};

}  // namespace kvpark::daemon
