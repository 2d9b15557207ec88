// The daemon-private state segment: what the index is rebuilt from when a new
// kvparkd adopts the arena of the one before it (systemd's fd store, docs/operations.md).
//
// One memfd, never shared with clients:
//   [0, 4 KiB)            StateHeader, written once at creation, then checked at adoption
//   [4 KiB, 8 KiB)        StateHints: the record high-water mark (a hint, clamped)
//   namespaces            namespaces_max NamespaceRecord, by namespace index
//   connections           connections_max words: the pid of each connected engine
//   records               record_capacity StateRecord: one per sealed host entry, and
//                         one per reserved extent (a reservation record)
// The crash rule: a kill -9 at any instruction leaves every record whole and valid or
// recognisably invalid. A record is written body first, then its checksum, then its
// `valid` word (one aligned 8-byte store, ordered after the rest); it is cleared by
// storing 0 in `valid` first. A record that fails its checksum is dropped at
// adoption, never trusted. Fields after the checksummed body are hints that any
// value leaves safe (class/evidence upgrades carry their own check; hits and last
// use only steer eviction). A reservation record has the same layout and rule with
// its own valid word: an extent an engine may still be writing into when the daemon
// dies, which the next instance holds as long as it holds adopted entries. Sealing
// rewrites it in place as the entry's record (its valid word is 0 in between: the
// engine has finished writing by then, so nothing is lost if a crash falls there).
// Bump state_format_version whenever a layout changes. Version 1 (no reservation
// records) is still adopted: it is version 2 with none written.
#pragma once

#include <cstdint>
#include <type_traits>

#include "proto/limits.h"
#include "proto/types.h"

namespace kvpark::shm {

inline constexpr uint32_t state_magic = 0x5350564b;  // "KVPS"
inline constexpr uint16_t state_format_version = 2;
inline constexpr uint16_t state_format_oldest_adopted = 1;
inline constexpr uint64_t state_record_valid = 0x444c4156454e5456;  // a valid record's word
inline constexpr uint64_t state_reservation_valid = 0x5652455356524553;  // a reservation's
inline constexpr uint64_t state_namespace_valid = 0x444c41564e53504b;
inline constexpr uint32_t state_connection_tag = 0x4e4e4f43;  // low half of a connection word
inline constexpr uint64_t state_header_bytes = 4096;
inline constexpr uint64_t state_hints_bytes = 4096;

struct StateHeader {
  uint32_t magic;
  uint16_t format_version;
  uint16_t arena_format_version;  // of the arena this state describes
  uint16_t entry_format_version;
  uint16_t huge_pages;              // the configured setting (shm::HugePages)
  uint32_t record_bytes;            // sizeof(StateRecord)
  uint64_t arena_identity;          // the arena header's incarnation
  uint64_t arena_data_bytes;        // the data object's size
  uint64_t configured_arena_bytes;  // --arena-size as configured
  uint64_t record_capacity;
  uint32_t namespace_capacity;
  uint32_t connection_capacity;
  uint64_t created_unix_usec;
  uint64_t checksum;  // XXH3-64 of the bytes before it
};
static_assert(std::is_trivially_copyable_v<StateHeader>);
static_assert(sizeof(StateHeader) == 72);
static_assert(sizeof(StateHeader) <= state_header_bytes);

struct StateHints {
  uint64_t records_high_water;  // records at or past it were never written
};

struct NamespaceRecord {
  uint64_t valid;     // state_namespace_valid; written last
  uint64_t checksum;  // XXH3-64 of the fields after it
  NamespaceId id;
  uint64_t block_payload_bytes;
  uint32_t block_tokens;
  uint32_t snapshot_required;
  uint32_t prefill_tokens_per_second;
  uint32_t reserved0;
  uint64_t reserved1;
};
static_assert(std::is_trivially_copyable_v<NamespaceRecord>);
static_assert(sizeof(NamespaceRecord) == 64);

// What a sealed host entry is, checksummed as a whole.
struct StateRecordBody {
  NamespaceId namespace_id;
  Hash128 key_hash;        // block: its chain hash; snapshot: its anchor hash
  Hash128 parent_hash;     // block: h[i-1]
  uint64_t extent_offset;  // data-region offset
  uint64_t extent_bytes;
  uint64_t payload_checksum;  // XXH3-64, as sealed
  uint64_t creator_session;
  uint64_t tail_digest;  // snapshot: XXH3-64 of its tail token ids (0 for blocks)
  uint64_t sequence;     // the write's number: ties the upgrade word to this write
  uint32_t position;
  uint32_t anchor_chunks;
  uint32_t tail_tokens;  // snapshot: how many tail token ids the extent holds
  uint8_t kind;          // EntryKind
  uint8_t entry_class;   // EntryClass at seal
  uint8_t evidence;      // Evidence at seal
  uint8_t reserved0;
};
static_assert(std::is_trivially_copyable_v<StateRecordBody>);
static_assert(sizeof(StateRecordBody) == 112);

struct StateRecord {
  uint64_t valid;     // state_record_valid (or _reservation_valid) once body and checksum are whole
  uint64_t checksum;  // XXH3-64 of body
  StateRecordBody body;
  // Hints, outside the checksum.
  uint64_t upgrade;  // class | evidence << 8 | pinned << 16 | check << 32
  uint64_t hits;
  uint64_t last_use_usec;  // CLOCK_MONOTONIC_COARSE, which outlives the process
};
static_assert(std::is_trivially_copyable_v<StateRecord>);
static_assert(sizeof(StateRecord) == 152);

// Every host entry holds its header page and at least one payload page, so an arena
// never holds more sealed entries than this.
constexpr uint64_t state_record_capacity_for(uint64_t arena_data_bytes) {
  return arena_data_bytes / (2 * limits::extent_align_bytes);
}

}  // namespace kvpark::shm
