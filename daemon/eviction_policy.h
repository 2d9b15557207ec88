// Host eviction policy: which evictable entry goes when the arena needs room. The
// entry table says what is evictable and keeps it in LRU order (eviction_order.h);
// this picks from the cold end by value (value_model.h), as a cache keeps its
// eviction policy apart from its index and its allocator.
#pragma once

#include <cstddef>

#include "daemon/entry_table.h"

namespace kvpark::daemon {

// Eviction looks this far up from the cold end of the LRU list for the least valuable
// entry: value-aware without a priority queue, and still mostly LRU (roots of a chain
// are the most recent of it, so a chain is still eaten from its end).
inline constexpr size_t eviction_sample_entries = 8;

// Of the eviction_sample_entries least recently used host-evictable entries, the one
// of least value density, all rated at one instant (the colder on a tie); no_slot
// when nothing is evictable. A HostVictimPolicy.
EntrySlot least_valuable_of_coldest(const EntryTable& table);

// What evicting a host entry gives up: its value density times its bytes (value_model.h).
// A HostEvictionCost.
double host_eviction_value(const EntryTable& table, EntrySlot slot);

}  // namespace kvpark::daemon
