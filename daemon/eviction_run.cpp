// The cheapest run of free space and evictable entries (eviction_run.h): two pointers
// over the pieces, each run kept minimal.
#include "daemon/eviction_run.h"

namespace kvpark::daemon {

bool cheapest_run(std::span<const ArenaPiece> pieces, uint64_t bytes, size_t* ret_first,
                  size_t* ret_end) {
  bool found = false;
  double best_cost = 0;
  uint64_t best_evicted = 0;
  size_t first = 0;
  uint64_t run_bytes = 0, run_evicted = 0;
  double run_cost = 0;
  for (size_t end = 0; end < pieces.size(); ++end) {
    const ArenaPiece& p = pieces[end];
    const bool adjacent =
        end > first && pieces[end - 1].offset + pieces[end - 1].bytes == p.offset;
    if (!p.evictable || (end > first && !adjacent)) {  // a run cannot cross it: start over
      first = p.evictable ? end : end + 1;
      run_bytes = run_evicted = 0;
      run_cost = 0;
      if (!p.evictable) continue;
    }
    run_bytes += p.bytes;
    run_cost += p.cost;
    if (p.slot != no_slot) run_evicted += p.bytes;
    // Keep the run minimal: drop its first piece while the rest still holds `bytes`.
    while (first < end && run_bytes - pieces[first].bytes >= bytes) {
      run_bytes -= pieces[first].bytes;
      run_cost -= pieces[first].cost;
      if (pieces[first].slot != no_slot) run_evicted -= pieces[first].bytes;
      ++first;
    }
    if (run_bytes < bytes) continue;
    if (!found || run_cost < best_cost ||
        (run_cost == best_cost && run_evicted < best_evicted)) {
      found = true;
      best_cost = run_cost;
      best_evicted = run_evicted;
      *ret_first = first;
      *ret_end = end + 1;
    }
  }
  return found;
}

}  // namespace kvpark::daemon
