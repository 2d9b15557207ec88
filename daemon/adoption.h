// Adoption: a new kvparkd takes over the arena and state segment an earlier one
// left with the service manager, and rebuilds its index from the state's records.
//
// take_over() decides: the kept objects are adopted only when they are whole (the
// arena's header and seals, the state's header checksum), name each other (the
// state's arena identity and size) and agree with this configuration (arena size
// and huge_pages as configured, every format version); otherwise the daemon starts
// fresh and says why in one line. adopt_entries() reads each record, keeps those
// that pass every check (record checksum, namespace, extent inside the arena and
// overlapping no other; for a snapshot, the entry header in the arena naming the same
// entry and its tail tokens matching their digest) and drops the rest, counted by
// reason. No payload is read, and no arena page of a block: readers confirm headers,
// token ids and payload checksums anyway. A reservation record (an extent an engine
// may still be writing into) is held like an adopted entry and freed when the
// adoption hold ends; it is never indexed. Free space is what no kept record covers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/entry_state.h"
#include "daemon/fd_store.h"
#include "shm/arena.h"
#include "shm/state_segment.h"

namespace kvpark::daemon {

class EntryTable;

struct AdoptionConfig {
  uint64_t configured_arena_bytes = 0;
  shm::HugePages huge_pages = shm::HugePages::Try;
};

struct KeptArena {
  std::unique_ptr<shm::ArenaOwner> arena;
  std::unique_ptr<shm::StateSegment> state;
};

// Adopts what the manager kept when it agrees with `config`; false otherwise, with
// ret_reason (empty when nothing was kept). Takes the fds either way.
bool take_over(StoredFds& fds, const AdoptionConfig& config, KeptArena& ret_kept,
               std::string& ret_reason);

enum class DropReason : uint8_t {
  Damaged,    // the record fails its checksum (torn by a crash, or written over)
  Namespace,  // its namespace record is missing or damaged
  Extent,     // outside the arena, or overlapping another kept entry, or a duplicate key
  Header,     // a snapshot's entry header in the arena does not name this entry
  Tail,       // a snapshot's tail tokens in the arena do not match the record
};
inline constexpr size_t drop_reason_count = 5;
const char* drop_reason_name(DropReason reason);  // "damaged", "namespace", ...

struct AdoptionReport {
  bool adopted = false;
  bool index_image = false;  // the index the previous instance left was adopted, not rebuilt
  uint64_t entries = 0;
  uint64_t bytes = 0;  // extents
  uint64_t usec = 0;   // reading the records and rebuilding the index
  uint64_t reservations = 0;  // extents reserved when the previous instance stopped, held
  uint64_t reservation_bytes = 0;
  uint64_t dropped[drop_reason_count] = {};
  std::vector<uint32_t> previous_pids;  // engines the previous instance had connected
  uint64_t dropped_total() const;
  // "adopted N entries (X GiB) from the previous instance in T ms[, its index kept]
  // [, holding R extents (M MiB) reserved when it stopped]; dropped ..."
  std::string summary() const;
};

// A whole, aligned, nonempty extent inside the arena's data region.
bool extent_inside_arena(const shm::StateRecordBody& b, uint64_t arena_bytes);

struct NamespaceInfo;
// The checks a kept record passes before its entry is adopted: its shape for its
// namespace and its extent inside the arena; for a snapshot, the entry header in the
// arena naming it and its tail tokens (copied into ret_tail) matching the record's
// digest. False with the reason it is dropped.
bool record_adoptable(const shm::StateRecordBody& b, const NamespaceInfo& info,
                      const uint8_t* arena_data, uint64_t arena_bytes,
                      std::vector<int32_t>& ret_tail, DropReason& ret_reason);

// Rebuilds `table` (which must keep its records in `state`) from the segment over
// the adopted arena's data region.
AdoptionReport adopt_entries(EntryState& state, const uint8_t* arena_data, uint64_t arena_bytes,
                             EntryTable& table);

}  // namespace kvpark::daemon
