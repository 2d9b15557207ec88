// Entry headers and arena faults (see entry_header.h).
#include "daemon/entry_header.h"

#include "daemon/log.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {

shm::EntryHeader make_entry_header(const Entry& e, const NamespaceInfo& ns, uint32_t token_count,
                                   uint64_t payload_bytes, uint64_t incarnation) {
  shm::EntryHeader h{};
  h.magic = shm::entry_magic;
  h.format_version = shm::entry_format_version;
  h.kind = static_cast<uint8_t>(e.kind);
  h.namespace_id = ns.id;
  h.key_hash = e.key_hash;
  h.payload_bytes = payload_bytes;
  h.payload_offset = shm::payload_offset_for(token_count);
  h.token_count = token_count;
  h.position = e.position;
  h.anchor_chunks = e.anchor_chunks;
  h.incarnation = incarnation;
  return h;
}

void log_arena_fault(uint64_t extent_offset) {
  log_warning_limited("kvparkd: the arena page at offset %llu is gone (a client punched a hole, and no page "
                      "was left to refill it); the entry there is dropped (%llu such faults so far)",
                      static_cast<unsigned long long>(extent_offset),
                      static_cast<unsigned long long>(shm::arena_faults()));
}

}  // namespace kvpark::daemon
