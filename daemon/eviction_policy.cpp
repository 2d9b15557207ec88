// Sampled value-aware host eviction (see eviction_policy.h).
#include "daemon/eviction_policy.h"

#include "daemon/clock.h"
#include "daemon/value_model.h"

namespace kvpark::daemon {

EntrySlot least_valuable_of_coldest(const EntryTable& table) {
  EntrySlot victim = table.host_lru_tail();
  if (victim == no_slot) return no_slot;
  const uint64_t now = coarse_monotonic_usec();
  auto value = [&](EntrySlot slot) {
    const Entry& e = table.entry(slot);
    return value_density(e, table.namespace_info(e.ns), now);
  };
  double lowest = value(victim);
  EntrySlot slot = table.host_lru_prev(victim);
  for (size_t seen = 1; seen < eviction_sample_entries && slot != no_slot; ++seen) {
    const double v = value(slot);
    if (v < lowest) {
      lowest = v;
      victim = slot;
    }
    slot = table.host_lru_prev(slot);
  }
  return victim;
}

double host_eviction_value(const EntryTable& table, EntrySlot slot) {
  const Entry& e = table.entry(slot);
  return value_density(e, table.namespace_info(e.ns), coarse_monotonic_usec()) *
         double(e.extent_bytes);
}

}  // namespace kvpark::daemon
