// The entry headers the daemon writes at the front of every extent (shm/arena_format.h:
// `[EntryHeader | token ids | payload]`), and its one report of an arena page a
// client took away (shm/arena_guard.h).
#pragma once

#include <cstdint>

#include "daemon/entry.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

// The header of `e` in namespace `ns` as this daemon instance (`incarnation`) writes it.
shm::EntryHeader make_entry_header(const Entry& e, const NamespaceInfo& ns, uint32_t token_count,
                                   uint64_t payload_bytes, uint64_t incarnation);
// The tokens e's extent holds (a block's, or a snapshot's tail) and whether `h`, read
// from its extent, names e in namespace `ns` with sizes that fit its extent.
uint32_t entry_token_count(const Entry& e, const NamespaceInfo& ns);
bool header_names_entry(const shm::EntryHeader& h, const Entry& e, const NamespaceInfo& ns);
// Whether e's payload in the arena (`arena_data`) still hashes to the checksum it was
// sealed with. Its header is checked first: one that does not name e, or a page a
// client took away, is not intact. Reads the whole payload, in pieces.
bool payload_intact(const uint8_t* arena_data, const Entry& e, const NamespaceInfo& ns);
// A guarded access to the arena failed: logged, rate-limited.
void log_arena_fault(uint64_t extent_offset);
// Writes `header` at the front of e's extent (`arena_data`: the daemon's mapping)
// through a guarded copy; false, logged, when a client took the page away.
bool write_entry_header(uint8_t* arena_data, const Entry& e, const shm::EntryHeader& header);
// The header at the front of e's extent; a zeroed one (naming no entry), logged, when
// a client took the page away.
shm::EntryHeader read_entry_header(const uint8_t* arena_data, const Entry& e);

}  // namespace kvpark::daemon
