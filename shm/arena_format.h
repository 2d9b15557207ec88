// Shared-memory layouts: the arena header and the header of each entry extent.
//
// The arena is two memfds (arena.h):
//   header object  one page: ArenaHeader, written once by the daemon, then sealed
//                  against writes (F_SEAL_WRITE): no process can change it
//   data object    the data region, carved into extents; sealed against shrink and
//                  grow, so no client can make the daemon take SIGBUS
// An extent holds one entry:
//   [0, entry_header_bytes)            EntryHeader (written by the daemon at reserve)
//   [entry_header_bytes, payload)      the entry's token ids, int32 (written by the client)
//   [payload_offset, +payload_bytes)   the payload (written by the client before seal)
// Whatever a reader trusts about a sealed payload beyond these bytes (its checksum)
// is daemon-private and travels in LOOKUP replies. No lock lives here: the daemon
// alone owns metadata and lifetimes (DESIGN.md §3).
// Bump the matching format_version whenever a layout changes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "proto/limits.h"
#include "proto/types.h"

namespace kvpark::shm {

inline constexpr uint32_t arena_magic = 0x4150564b;  // "KVPA"
inline constexpr uint16_t arena_format_version = 2;  // 2: separate sealed header object

// How the data region is backed (reported in status and metrics).
enum class ArenaPages : uint32_t {
  Small = 0,        // 4 KiB shmem pages
  Transparent = 1,  // shmem with transparent huge pages
  Hugetlb = 2,      // a hugetlb memfd (reserved huge pages, vm.nr_hugepages)
};

struct ArenaHeader {
  uint32_t magic;
  uint16_t format_version;
  uint16_t header_bytes;     // == limits::arena_header_bytes
  uint64_t data_bytes;       // size of the data object
  uint64_t incarnation;      // random per daemon start; a client checks it against HELLO
  uint64_t created_unix_usec;
  uint32_t extent_align_bytes;
  uint32_t entry_header_bytes;
  uint32_t pages;            // ArenaPages
  uint32_t page_bytes;       // page size backing the data region (bytes)
};
static_assert(std::is_trivially_copyable_v<ArenaHeader>);
static_assert(sizeof(ArenaHeader) == 48);
static_assert(sizeof(ArenaHeader) <= limits::arena_header_bytes);

inline constexpr uint32_t entry_magic = 0x4550564b;  // "KVPE"
inline constexpr uint16_t entry_format_version = 2;  // 2: payloads start on a page

struct EntryHeader {
  uint32_t magic;
  uint16_t format_version;
  uint8_t kind;         // EntryKind
  uint8_t reserved0;
  NamespaceId namespace_id;
  Hash128 key_hash;      // block: its chain hash; snapshot: its anchor hash
  uint64_t payload_bytes;
  uint32_t payload_offset;  // from the extent start
  uint32_t token_count;     // block: block_tokens; snapshot: tail tokens
  uint32_t position;        // tokens covered once this entry is restored
  uint32_t anchor_chunks;   // snapshot: whole chunks before its tail; block: its chain index
  uint64_t incarnation;     // daemon incarnation that reserved the extent
};
static_assert(std::is_trivially_copyable_v<EntryHeader>);
static_assert(sizeof(EntryHeader) == 72);
static_assert(sizeof(EntryHeader) <= limits::entry_header_bytes);

constexpr uint64_t align_up(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

// Offset of the payload inside an extent holding `token_count` token ids.
constexpr uint32_t payload_offset_for(uint32_t token_count) {
  return static_cast<uint32_t>(
      align_up(limits::entry_header_bytes + uint64_t{token_count} * sizeof(int32_t),
               limits::payload_align_bytes));
}

// Arena bytes an entry occupies.
constexpr uint64_t extent_bytes_for(uint32_t token_count, uint64_t payload_bytes) {
  return align_up(payload_offset_for(token_count) + payload_bytes, limits::extent_align_bytes);
}

}  // namespace kvpark::shm
