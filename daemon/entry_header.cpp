// Entry headers and arena faults (see entry_header.h).
#include "daemon/entry_header.h"

#include <algorithm>
#include <new>
#include <vector>

#include "daemon/log.h"
#include "proto/xxh3.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {
namespace {

// Payloads are read through a bounce buffer this big (guarded copies, then hashed).
constexpr size_t verify_piece_bytes = 256u << 10;

}  // namespace

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

uint32_t entry_token_count(const Entry& e, const NamespaceInfo& ns) {
  return e.kind == EntryKind::Block ? ns.geometry.block_tokens
                                    : static_cast<uint32_t>(e.tail_tokens.size());
}

bool header_names_entry(const shm::EntryHeader& h, const Entry& e, const NamespaceInfo& ns) {
  const uint32_t tokens = entry_token_count(e, ns);
  return h.magic == shm::entry_magic && h.format_version == shm::entry_format_version &&
         h.kind == static_cast<uint8_t>(e.kind) && h.namespace_id == ns.id &&
         h.key_hash == e.key_hash && h.token_count == tokens && h.position == e.position &&
         h.payload_offset == shm::payload_offset_for(tokens) &&
         h.payload_bytes <= e.extent_bytes &&  // no wrap in the sum below
         shm::extent_bytes_for(tokens, h.payload_bytes) == e.extent_bytes &&
         (e.kind != EntryKind::Block || h.payload_bytes == ns.geometry.block_payload_bytes);
}

bool payload_intact(const uint8_t* arena_data, const Entry& e, const NamespaceInfo& ns) {
  shm::EntryHeader h{};
  if (!e.on_host || !shm::guarded_copy(&h, arena_data + e.extent_offset, sizeof h) ||
      !header_names_entry(h, e, ns))
    return false;
  std::vector<uint8_t> piece(
      static_cast<size_t>(std::min<uint64_t>(verify_piece_bytes, h.payload_bytes)));
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  const uint8_t* payload = arena_data + e.extent_offset + h.payload_offset;
  bool readable = true;
  for (uint64_t at = 0; readable && at < h.payload_bytes; at += piece.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), h.payload_bytes - at));
    readable = shm::guarded_copy(piece.data(), payload + at, n);
    if (readable) XXH3_64bits_update(state, piece.data(), n);
  }
  const bool intact = readable && XXH3_64bits_digest(state) == e.payload_checksum;
  XXH3_freeState(state);
  return intact;
}

void log_arena_fault(uint64_t extent_offset) {
  log_warning_limited("kvparkd: the arena page at offset %llu is gone (a client punched a hole, and no page "
                      "was left to refill it); the entry there is dropped (%llu such faults so far)",
                      static_cast<unsigned long long>(extent_offset),
                      static_cast<unsigned long long>(shm::arena_faults()));
}

bool write_entry_header(uint8_t* arena_data, const Entry& e, const shm::EntryHeader& header) {
  if (shm::guarded_copy(arena_data + e.extent_offset, &header, sizeof header)) return true;
  log_arena_fault(e.extent_offset);
  return false;
}

shm::EntryHeader read_entry_header(const uint8_t* arena_data, const Entry& e) {
  shm::EntryHeader h{};
  if (shm::guarded_copy(&h, arena_data + e.extent_offset, sizeof h)) return h;
  log_arena_fault(e.extent_offset);
  return shm::EntryHeader{};
}

}  // namespace kvpark::daemon
