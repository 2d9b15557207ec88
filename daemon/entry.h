// What the daemon knows of each parked entry and namespace: the records the entry
// table indexes (entry_table.h), orders for eviction (eviction_order.h) and values
// (value_model.h). Plain data; the entry table alone changes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include "proto/types.h"

namespace kvpark::daemon {

using EntrySlot = uint32_t;
inline constexpr EntrySlot no_slot = UINT32_MAX;
// No entry's id (EntryTable::entry_id: its slot is never no_slot).
inline constexpr uint64_t no_entry_id = UINT64_MAX;
using NamespaceIndex = uint32_t;
// No record in the state segment (entry_state.h).
inline constexpr uint32_t no_record = UINT32_MAX;

struct NamespaceInfo {
  NamespaceId id;
  Geometry geometry;
  uint32_t chain_tokens = 0;          // hash granularity
  uint64_t block_extent_bytes = 0;    // 0 for snapshot-only namespaces
  uint32_t prefill_tokens_per_second = 0;
  uint64_t blocks = 0;                // sealed
  uint64_t snapshots = 0;             // sealed
  uint64_t bytes = 0;                 // sealed extents on the host
  uint64_t disk_bytes = 0;            // records on disk
  uint64_t indexed_snapshots = 0;     // reserved or sealed: lookups skip the search at 0
  // Since the daemon started: tokens lookups found restorable, and tokens clients
  // reported restored when they released the lease.
  uint64_t restorable_tokens = 0;
  uint64_t restored_tokens = 0;
};

// A snapshot's tail token ids, owned by the entry table (allocated when the entry is
// made, freed with its slot): a plain pointer and count, so an Entry is plain data that
// a kept index image (index_image.h) can hold. Empty for blocks.
struct TailTokens {
  const int32_t* data = nullptr;
  uint32_t count = 0;
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
  const int32_t* begin() const { return data; }
  const int32_t* end() const { return data + count; }
  operator std::span<const int32_t>() const { return {data, count}; }
};

// The first cache line holds what adopting a kept index image checks against each
// entry's state record (index_image.h): that check reads one line an entry.
struct Entry {
  Hash128 key_hash;                  // block chain hash, or snapshot anchor hash
  uint64_t extent_offset = 0;        // data-region offset, valid when on_host
  uint64_t extent_bytes = 0;         // the entry's image size, whatever its tier
  TailTokens tail_tokens;            // snapshots only
  NamespaceIndex ns = 0;
  uint32_t state_record = no_record;  // its record in the state segment, if any
  EntryKind kind = EntryKind::Block;
  bool in_use = false;               // slab slot holds an entry
  Hash128 parent_hash;               // block: h[i-1] (the namespace id for block 0)
  uint64_t disk_bytes = 0;           // record file bytes, when on_disk
  uint64_t creator_session = 0;
  uint64_t payload_checksum = 0;     // XXH3-64 of the payload, from SEAL (or the disk record)
  uint64_t hits = 0;
  uint64_t last_use_tick = 0;
  uint64_t last_use_usec = 0;        // CLOCK_MONOTONIC_COARSE
  uint32_t position = 0;             // tokens restored through this entry
  uint32_t anchor_chunks = 0;
  uint32_t leases = 0;
  uint32_t io_pins = 0;              // spills or restores in flight
  // Records that lead from this one's record on disk (blocks after it, snapshots at it),
  // written or being written: while any do, disk eviction leaves this record alone.
  uint32_t disk_dependents = 0;
  uint64_t disk_predecessor_id = no_entry_id;  // the entry_id of the record this one holds
  uint32_t reserved_by = 0;          // connection writing it, while reserved
  EntrySlot lru_prev = no_slot;
  EntrySlot lru_next = no_slot;
  EntrySlot disk_prev = no_slot;
  EntrySlot disk_next = no_slot;
  EntryClass entry_class = EntryClass::Private;
  Evidence evidence = Evidence::DefaultAutomatic;
  bool sealed = false;
  bool pinned = false;
  bool on_host = true;     // has an arena extent
  bool on_disk = false;    // has a verified disk record (its id follows from the key)
  bool promoting = false;  // extent allocated, disk restore still filling it
  bool dead = false;
  bool on_lru = false;
  bool on_disk_lru = false;
  bool adoption_hold = false;  // adopted; a lease of the previous daemon may still read it
};
static_assert(std::is_trivially_copyable_v<Entry>, "an index image holds entries as bytes");
static_assert(offsetof(Entry, in_use) < 64 && sizeof(Entry) % 64 == 0,
              "what adopting an index image checks shares each entry's first cache line");

struct NewEntry {
  NamespaceIndex ns = 0;
  EntryKind kind = EntryKind::Block;
  Hash128 key_hash;
  Hash128 parent_hash;                   // blocks: the predecessor's chain hash
  std::span<const int32_t> tail_tokens;  // snapshots
  uint64_t extent_bytes = 0;
  uint32_t position = 0;
  uint32_t anchor_chunks = 0;
  uint64_t creator_session = 0;
  uint64_t payload_checksum = 0;  // entries recovered from disk
  EntryClass entry_class = EntryClass::Private;
  Evidence evidence = Evidence::DefaultAutomatic;
  uint32_t reserved_by = 0;
};

}  // namespace kvpark::daemon
