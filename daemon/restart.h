// What one kvparkd instance takes over from the one before it, and leaves for the one
// after: at start, the adopted arena's index, from the image the
// last instance left when every check holds, else rebuilt from the state records; at
// stop, the index left in the kept memory.
#pragma once

#include "daemon/adoption.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/kept_memory.h"
#include "daemon/park.h"
#include "shm/arena.h"

namespace kvpark::daemon {

// After open_host_tier: when it adopted the arena, the previous instance's entries go
// into `table` (its clients' leases held for a grace period); on a fresh start, any
// index image left is discarded. What was adopted, for status (empty when fresh).
AdoptionReport take_over_index(bool adopted, KeptMemory* index_memory, EntryState* entry_state,
                               const shm::ArenaOwner& arena, EntryTable& table, Park& park);

// Once the index is whole (after disk recovery): kept index memory it does not need
// goes back to the system.
void release_unused_index_memory(KeptMemory* index_memory);

// At stop, after the core stopped: the index, for the next instance to adopt when this
// stop was clean, or its pages to rebuild it in.
void leave_index(EntryTable& table, const EntryState* entry_state, KeptMemory* index_memory);

}  // namespace kvpark::daemon
