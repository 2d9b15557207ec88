// The index image: a daemon that stops cleanly under a service manager leaves its entry
// table's arrays (slab, slot generations, free slots, block index cells) where they
// are, in the kept index memory (kept_memory.h), and describes them in the memory's
// header unit. The next instance adopts them in place instead of rebuilding the index
// from the state records: the rebuild writes about 250 bytes an entry (160-180 ms for
// 1M entries on the reference VM), the image is mapped and checked.
//
// Trusted for nothing the state segment does not confirm. The header is checksummed
// and names the build's entry layout, the arena and the records it was written over;
// it is invalidated the moment a new instance reads it, so an image is adopted at most
// once and never after a crash (a killed daemon writes none: its successor rebuilds).
// At adoption every state record is checked as a rebuild checks it, and each valid
// record's entry in the image must name it back with the same key, namespace, kind and
// extent; the count of entries must equal the count of valid records; the arrays the
// records do not vouch for (cells, generations, free slots) must match checksums taken
// at the stop; free space is recomputed from the records. Anything else refuses the
// image (one log line says why) and the index is rebuilt from the records as before.
// What the image cannot hold is rebuilt: namespaces' lookup map, snapshots' tail
// tokens (read from the arena, checked against their records' digests) and index.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/adoption.h"

namespace kvpark::daemon {

class EntryTable;
class EntryState;
class KeptMemory;

// Bump when the image's header or the meaning of anything it holds changes (entry
// fields included: the layout is also checked, field by field).
inline constexpr uint32_t index_image_format_version = 1;

// At a clean stop, after the event loop and every I/O have stopped: turns `table` into
// the shape adoption gives it (adopted entries held, no leases, no disk copies: the
// disk tier's recovery attaches them again) and describes it in `memory`'s header.
// False with ret_why_not when it cannot (I/O still in flight, no room for an array).
// The table serves nothing afterwards: the daemon is exiting.
bool write_index_image(EntryTable& table, const EntryState& state, KeptMemory& memory,
                       std::string& ret_why_not);

// At start, into an empty table that keeps its records in `state`: adopts the image in
// `memory` when every check above holds (true, `report` filled as adopt_entries fills
// it). False with ret_why_not otherwise (empty when no image was there); the table and
// state are untouched then, and the image's pages are free to reuse.
bool adopt_index_image(KeptMemory& memory, EntryState& state, const uint8_t* arena_data,
                       uint64_t arena_bytes, EntryTable& table, AdoptionReport& report,
                       std::string& ret_why_not);

// Where a valid image in `memory` keeps one of its arrays ("slots", "generations",
// "free_slots", "cells", "record_slots"): the memfd offset and the bytes in use. For
// tests that write over one; false when there is no valid image or no such array.
bool find_index_image_array(const KeptMemory& memory, std::string_view name, uint64_t& ret_offset,
                            uint64_t& ret_used_bytes);

// A start that adopts no arena: an image left in `memory` describes nothing any more.
void discard_index_image(KeptMemory& memory);

}  // namespace kvpark::daemon
