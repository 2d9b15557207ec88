// The daemon's index of parked entries: namespaces, blocks, snapshots, placement
// in the arena, reference counts and the eviction order.
//
// Invariants:
//  - every entry owns exactly one extent of the arena's data region;
//  - an entry is either reserved (being written by one client, invisible to
//    lookups) or sealed (immutable, visible);
//  - a sealed entry is on the LRU list iff it has no lease and no pin: the list
//    holds exactly the entries eviction may take, oldest at the tail;
//  - evictable_bytes() is the sum of extents on the LRU list.
// Blocks are keyed by (namespace, chain hash), snapshots by (namespace, anchor
// hash, tail tokens); identical content is therefore stored once.
// Single-threaded: the daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <ctime>
#include <span>
#include <unordered_map>
#include <vector>

#include "proto/status.h"
#include "proto/types.h"
#include "shm/extent_allocator.h"

namespace kvpark::daemon {

using EntrySlot = uint32_t;
inline constexpr EntrySlot no_slot = UINT32_MAX;
using NamespaceIndex = uint32_t;

struct NamespaceInfo {
  NamespaceId id;
  Geometry geometry;
  uint32_t chain_tokens = 0;          // hash granularity
  uint64_t block_extent_bytes = 0;    // 0 for snapshot-only namespaces
  uint32_t prefill_tokens_per_second = 0;
  uint64_t blocks = 0;                // sealed
  uint64_t snapshots = 0;             // sealed
  uint64_t bytes = 0;                 // sealed extents
};

struct Entry {
  Hash128 key_hash;                  // block chain hash, or snapshot anchor hash
  std::vector<int32_t> tail_tokens;  // snapshots only
  uint64_t extent_offset = 0;        // data-region offset
  uint64_t extent_bytes = 0;
  uint64_t creator_session = 0;
  uint64_t hits = 0;
  uint64_t last_use_tick = 0;
  uint64_t last_use_usec = 0;        // CLOCK_MONOTONIC_COARSE
  NamespaceIndex ns = 0;
  uint32_t position = 0;             // tokens restored through this entry
  uint32_t anchor_chunks = 0;
  uint32_t leases = 0;
  EntrySlot lru_prev = no_slot;
  EntrySlot lru_next = no_slot;
  EntryKind kind = EntryKind::Block;
  EntryClass entry_class = EntryClass::Private;
  Evidence evidence = Evidence::DefaultAutomatic;
  bool sealed = false;
  bool pinned = false;
  bool in_use = false;  // slab slot holds an entry
};

struct NewEntry {
  NamespaceIndex ns = 0;
  EntryKind kind = EntryKind::Block;
  Hash128 key_hash;
  std::span<const int32_t> tail_tokens;  // snapshots
  uint64_t extent_bytes = 0;
  uint32_t position = 0;
  uint32_t anchor_chunks = 0;
  uint64_t creator_session = 0;
  EntryClass entry_class = EntryClass::Private;
  Evidence evidence = Evidence::DefaultAutomatic;
};

class EntryTable {
 public:
  EntryTable(uint64_t data_bytes, uint64_t extent_align_bytes);

  // Namespaces: registered on first HELLO, kept while the daemon runs.
  Status register_namespace(const NamespaceId& id, const Geometry& geometry,
                            uint32_t prefill_tokens_per_second, NamespaceIndex& ret_ns);
  const NamespaceInfo& namespace_info(NamespaceIndex ns) const { return namespaces_.at(ns); }
  size_t namespace_count() const { return namespaces_.size(); }

  // Lookups by key; no_slot when absent. Reserved entries are returned too.
  EntrySlot find_block(NamespaceIndex ns, const Hash128& hash) const;
  EntrySlot find_snapshot(NamespaceIndex ns, const Hash128& anchor,
                          std::span<const int32_t> tail) const;
  // Sealed snapshots hanging off an anchor.
  std::span<const EntrySlot> snapshots_at(NamespaceIndex ns, const Hash128& anchor) const;

  // Places a new reserved entry, evicting unleased entries in LRU order if needed.
  // ArenaFull when even evicting everything evictable cannot make room; then
  // nothing is evicted (a request that can never fit costs no parked state).
  Status insert_reserved(const NewEntry& entry, EntrySlot& ret_slot);
  void seal(EntrySlot slot);
  void erase(EntrySlot slot);  // reserved or sealed-and-unleased entries

  void acquire_lease(EntrySlot slot);
  void release_lease(EntrySlot slot);
  void touch(EntrySlot slot);  // a hit: count it and make it most recent
  bool evict_lru();            // evicts the least recently used entry; false if none

  const Entry& entry(EntrySlot slot) const { return slots_.at(slot); }
  // Operator-visible ids: a slot and its reuse generation, so a stale id never
  // names a newer entry in the same slot.
  uint64_t entry_id(EntrySlot slot) const { return (uint64_t{generations_.at(slot)} << 32) | slot; }
  EntrySlot slot_for_id(uint64_t id) const;
  size_t slot_count() const { return slots_.size(); }  // iterate, skipping !in_use
  // Pinned entries are never evicted.
  void set_pinned(EntrySlot slot, bool pinned);
  uint64_t pinned() const { return pinned_; }

  uint64_t data_bytes() const { return allocator_.capacity_bytes(); }
  uint64_t bytes_free() const { return allocator_.bytes_free(); }
  uint64_t largest_free_bytes() const { return allocator_.largest_free_bytes(); }
  uint64_t evictable_bytes() const { return evictable_bytes_; }
  uint64_t blocks() const { return sealed_blocks_; }
  uint64_t snapshots() const { return sealed_snapshots_; }
  uint64_t evictions() const { return evictions_; }
  size_t slots_in_use() const { return slots_in_use_; }

 private:
  struct BlockKey {
    NamespaceIndex ns;
    Hash128 hash;
    bool operator==(const BlockKey&) const = default;
  };
  struct BlockKeyHasher {
    size_t operator()(const BlockKey& k) const noexcept { return Hash128Hasher{}(k.hash) ^ k.ns; }
  };

  bool evictable(const Entry& e) const { return e.sealed && e.leases == 0 && !e.pinned; }
  void lru_push_front(EntrySlot slot);
  void lru_unlink(EntrySlot slot);
  void evict_one();
  void remove_from_index(EntrySlot slot);

  shm::ExtentAllocator allocator_;
  std::vector<NamespaceInfo> namespaces_;
  std::unordered_map<NamespaceId, NamespaceIndex, Hash128Hasher> namespace_by_id_;
  std::vector<Entry> slots_;
  std::vector<uint32_t> generations_;  // bumped when a slot is freed
  std::vector<EntrySlot> free_slots_;
  std::unordered_map<BlockKey, EntrySlot, BlockKeyHasher> blocks_;
  std::unordered_map<BlockKey, std::vector<EntrySlot>, BlockKeyHasher> snapshots_;  // by anchor
  EntrySlot lru_head_ = no_slot;  // most recent
  EntrySlot lru_tail_ = no_slot;  // next to evict
  uint64_t evictable_bytes_ = 0;
  uint64_t tick_ = 0;
  uint64_t sealed_blocks_ = 0;
  uint64_t sealed_snapshots_ = 0;
  uint64_t evictions_ = 0;
  uint64_t pinned_ = 0;
  size_t slots_in_use_ = 0;
};

}  // namespace kvpark::daemon
