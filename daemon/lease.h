// A lease: what one LOOKUP found and holds for its connection until RELEASE (or
// close), and how a LOOKUP or WAIT reply describes it. Leased entries are off the
// eviction lists (entry_table.h); a lease also remembers the entries another engine
// was writing at LOOKUP time (single_flight.h) and the capture hint (recurrence.h).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "daemon/entry_table.h"
#include "proto/wire.h"

namespace kvpark::daemon {

using ConnectionId = uint32_t;  // the server's name for an engine connection

struct Lease {
  NamespaceIndex ns = 0;
  uint64_t session_id = 0;
  uint32_t prompt_tokens = 0;
  std::vector<EntrySlot> blocks;     // chain order
  std::vector<EntrySlot> snapshots;  // deepest first
  // Single flight: entries past the prefix that other engines were writing at
  // LOOKUP time (slot, entry id); WAIT returns when they are sealed or gone.
  std::vector<std::pair<EntrySlot, uint64_t>> inflight;
  uint32_t inflight_tokens = 0;
  uint32_t capture_hint_tokens = 0;
  bool remote_pending = false;  // the remote tier's existence check is still out
  // Its outcome is in the lookup counters: counted once settled, so a promotion
  // that fails is not counted restorable (Park::count_lookup).
  bool counted = false;
};

// shared_stable_prefix when the entry is shared or another session's, else
// private_turn_closure.
ReuseKind reuse_kind_of(const Entry& e, uint64_t session_id);
// No promotion of the lease in flight, and every in-flight entry it waits for is
// sealed or gone.
bool lease_settled(const EntryTable& table, const Lease& lease);
// Fills a LOOKUP/WAIT answer from the lease's current state; a dead entry (its disk
// copy failed verification) ends the usable chain.
void describe_lease(const EntryTable& table, uint64_t lease_id, const Lease& lease,
                    wire::LookupReply& ret);

}  // namespace kvpark::daemon
