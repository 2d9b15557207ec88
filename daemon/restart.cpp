#include "daemon/restart.h"

#include <string>

#include "daemon/clock.h"
#include "daemon/index_image.h"
#include "daemon/log.h"
#include "proto/limits.h"

namespace kvpark::daemon {

AdoptionReport take_over_index(bool adopted, KeptMemory* index_memory, EntryState* entry_state,
                               const shm::ArenaOwner& arena, EntryTable& table, Park& park) {
  AdoptionReport adoption;
  if (!adopted) {
    if (index_memory != nullptr) discard_index_image(*index_memory);
    return adoption;
  }
  // An adopted arena comes with its state segment (open_host_tier).
  std::string image_refused;
  if (index_memory == nullptr ||
      !adopt_index_image(*index_memory, *entry_state, arena.data(), arena.data_bytes(), table,
                         adoption, image_refused)) {
    if (!image_refused.empty()) {
      log_info("kvparkd: the kept index is not used (%s); rebuilding it from the state records",
               image_refused.c_str());
    }
    adoption = adopt_entries(*entry_state, arena.data(), arena.data_bytes(), table);
  }
  log_info("kvparkd: %s", adoption.summary().c_str());
  park.hold_adopted(adoption.previous_pids, monotonic_usec() + limits::adopted_lease_grace_usec);
  return adoption;
}

void release_unused_index_memory(KeptMemory* index_memory) {
  if (index_memory == nullptr) return;
  if (const uint64_t unused = index_memory->release_unused(); unused > 0) {
    log_info("kvparkd: gave back %llu MiB of kept index memory the index did not need",
             static_cast<unsigned long long>(unused >> 20));
  }
}

void leave_index(EntryTable& table, const EntryState* entry_state, KeptMemory* index_memory) {
  if (index_memory == nullptr) return;
  std::string why_not;
  if (entry_state != nullptr && write_index_image(table, *entry_state, *index_memory, why_not)) {
    log_info("kvparkd: left the index of %llu entries for the next instance",
             static_cast<unsigned long long>(table.slots_in_use()));
  } else if (!why_not.empty()) {
    log_info("kvparkd: left no index for the next instance: %s", why_not.c_str());
  }
  index_memory->keep_pages();
}

}  // namespace kvpark::daemon
