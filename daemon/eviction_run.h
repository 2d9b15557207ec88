// Making room for one large extent in a fragmented arena: the contiguous stretch of
// free space and evictable entries that is cheapest to evict, so a reservation frees
// what it needs (at most its size plus one entry), not whatever LRU order happens to
// free until some run is long enough.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "daemon/entry.h"

namespace kvpark::daemon {

// One stretch of the arena, in offset order: free space (slot no_slot), an entry
// eviction may take (with what evicting it costs), or one it may not.
struct ArenaPiece {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  EntrySlot slot = no_slot;
  bool evictable = true;  // free space is
  double cost = 0;        // of evicting it; 0 for free space
};

// The cheapest run of adjacent pieces, all free or evictable, that holds `bytes`
// (cost: the sum of its pieces'; among equals, the one evicting fewer bytes), as
// [*ret_first, *ret_end) of `pieces` (sorted by offset). Minimal: without its first
// piece it would not hold `bytes`. false when no run holds `bytes`.
bool cheapest_run(std::span<const ArenaPiece> pieces, uint64_t bytes, size_t* ret_first,
                  size_t* ret_end);

}  // namespace kvpark::daemon
