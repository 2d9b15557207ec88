// The daemon's index of parked entries: namespaces, blocks, snapshots, their
// placement (host arena, disk, or both), reference counts, leases and pins. It
// says what is evictable; the eviction order lives in eviction_order.h, and which
// entry eviction takes is the host victim policy's (eviction_policy.h).
//
// Invariants:
//  - an entry is reserved (being written by one client, invisible to lookups) or
//    sealed (immutable); a sealed entry lives on the host (an arena extent), on
//    disk (a record), or both; a reserved entry is always on the host;
//  - an entry is on the host eviction list iff host_evictable(): sealed, on the
//    host, readable (not promoting), no lease, no pin, no I/O in flight; the list
//    holds exactly what host eviction may take, oldest at the tail;
//  - likewise the disk eviction list holds exactly the disk_evictable() entries;
//  - a record being written or on disk holds its predecessor's (a block's previous
//    block, a snapshot's anchor block): a held record is not disk-evictable, so disk
//    eviction takes a chain from its tip and never leaves a record behind a missing one;
//  - evictable_bytes() is the sum of extents on the host eviction list;
//  - a dead entry (its disk copy failed verification while leased) is out of the
//    index and is freed when its last lease goes.
// Host eviction of an entry that has a disk copy only drops the host copy.
// With a state segment (entry_state.h), every host-readable sealed entry has a
// record there, written when it became readable and cleared before its extent is
// freed; entries adopted from an earlier daemon are held (not evictable) until
// release_adoption_hold(), since that daemon's clients may still be reading them.
// Blocks are keyed by (namespace, chain hash), snapshots by (namespace, anchor
// hash, tail tokens); identical content is therefore stored once.
// Single-threaded: the daemon's event loop owns it. (Adoption alone hands the block
// index and the extent claims to a helper thread, which writes the empty cells, then
// indexes and claims each batch one batch behind; it is joined before anything else
// reads them.)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "daemon/block_index.h"
#include "daemon/entry.h"
#include "daemon/entry_state.h"
#include "daemon/eviction_order.h"
#include "daemon/huge_page_allocator.h"
#include "proto/status.h"
#include "proto/types.h"
#include "shm/extent_allocator.h"

namespace kvpark::daemon {

class EntryTable;
// Chooses the entry host eviction takes, from the table's eviction order; no_slot
// only when nothing is evictable (eviction_policy.h).
using HostVictimPolicy = EntrySlot (*)(const EntryTable& table);
// What host-evicting an entry costs, for choosing which stretch of entries to evict
// when a large extent needs contiguous room (eviction_run.h).
using HostEvictionCost = double (*)(const EntryTable& table, EntrySlot slot);

class EntryTable {
 public:
  EntryTable(uint64_t data_bytes, uint64_t extent_align_bytes);
  ~EntryTable();
  EntryTable(const EntryTable&) = delete;
  EntryTable& operator=(const EntryTable&) = delete;

  // Namespaces: registered on first HELLO (or disk recovery). Past
  // limits::namespaces_max a new one takes the index of a namespace that holds no entry
  // (of any kind) and that `in_use` does not name: the caller's own references, its
  // connections and probes. LimitExceeded when there is none, or without `in_use`.
  Status register_namespace(const NamespaceId& id, const Geometry& geometry,
                            uint32_t prefill_tokens_per_second, NamespaceIndex& ret_ns,
                            const std::function<bool(NamespaceIndex)>& in_use = {});
  // Namespaces whose index a new one took since the daemon started.
  uint64_t namespaces_reused() const { return namespaces_reused_; }
  const NamespaceInfo& namespace_info(NamespaceIndex ns) const { return namespaces_.at(ns); }
  // Adds to a namespace's restorable and restored token counters.
  void count_tokens(NamespaceIndex ns, uint64_t restorable, uint64_t restored) {
    NamespaceInfo& info = namespaces_.at(ns);
    info.restorable_tokens += restorable;
    info.restored_tokens += restored;
  }
  size_t namespace_count() const { return namespaces_.size(); }

  // Lookups by key; no_slot when absent. Reserved entries are returned too.
  EntrySlot find_block(NamespaceIndex ns, const Hash128& hash) const;
  EntrySlot find_snapshot(NamespaceIndex ns, const Hash128& anchor,
                          std::span<const int32_t> tail) const;
  // Snapshots (reserved or sealed) hanging off an anchor.
  std::span<const EntrySlot> snapshots_at(NamespaceIndex ns, const Hash128& anchor) const;

  // Places a new reserved entry, evicting from the host in LRU order if needed.
  // ArenaFull when even evicting everything evictable cannot make room; then
  // nothing is evicted (a request that can never fit costs no parked state).
  Status insert_reserved(const NewEntry& entry, EntrySlot& ret_slot);
  // Keeps each host entry's record in `state` from now on (null: none kept).
  void set_state(EntryState* state) { state_ = state; }
  // Adoption, into an empty table: begin_adoption() makes room for up to `entries`;
  // insert_adopted() indexes a sealed host entry adopted from an earlier daemon at
  // exactly [extent_offset, +extent_bytes), whose record is `record`: Corrupt (nothing
  // changed) for a snapshot whose key and tail are already indexed. Entries are
  // indexed in batches (blocks: BlockIndex::insert_batch) and claim their extents only
  // then, in record order, after the duplicate blocks are out: a block whose key an
  // earlier record holds, or an entry whose range overlaps an extent taken before or
  // leaves the arena, is taken out again then and its record named in what
  // finish_adoption() returns (a key whose first record lost its range goes to the
  // next record of it that claims one). finish_adoption() makes every extent no
  // adopted entry holds free.
  struct Refused {
    std::vector<uint32_t> records;  // of entries refused as their batch was claimed
    uint64_t bytes = 0;             // their extents
    std::vector<uint32_t> reservation_records;  // of reservations refused likewise
  };
  void begin_adoption(size_t entries);
  Status insert_adopted(const NewEntry& entry, uint64_t extent_offset, uint32_t record,
                        uint64_t hits, uint64_t last_use_usec, bool pinned, EntrySlot& ret_slot);
  // An extent the earlier daemon had reserved, whose record is `record`: an engine may
  // still be writing into it, so it claims its extent like an adopted entry (refused
  // likewise) but is never indexed, and goes when the adoption hold ends.
  Status insert_adopted_reservation(const NewEntry& entry, uint64_t extent_offset, uint32_t record,
                                    EntrySlot& ret_slot);
  Refused finish_adoption();
  // Adopted entries become evictable like any other; adopted reservations are freed.
  void release_adoption_hold();
  uint64_t held_bytes() const { return held_bytes_; }  // entries' and reservations'
  uint64_t held_reservations() const { return held_reservations_; }
  // Indexes a sealed entry that exists only on disk (recovery after a restart).
  Status insert_on_disk(const NewEntry& entry, uint64_t disk_bytes, EntrySlot& ret_slot);
  // Seals a reserved entry, last used at now_usec: one stamp for a whole SEAL, so the
  // value function never ranks a chain's root below its tip (the LRU order decides).
  void seal(EntrySlot slot, uint64_t payload_checksum, uint64_t now_usec);
  void erase(EntrySlot slot);  // reserved, or sealed with no lease and no I/O

  // Host copy of a disk-only entry: allocates its extent (evicting as needed) and
  // marks it promoting until finish_promotion().
  Status begin_promotion(EntrySlot slot);
  // success: the extent now holds the image; failure: the extent is freed again.
  void finish_promotion(EntrySlot slot, bool success);
  // Disk copy bookkeeping (the caller does the I/O).
  void attach_disk_record(EntrySlot slot, uint64_t disk_bytes);
  // Forgets the disk copy; an entry left on no tier is erased (false returned).
  bool detach_disk_record(EntrySlot slot);
  // A spill about to write the entry's record holds its predecessor's from now on
  // (attach_disk_record() takes the hold too, for records found at recovery); a spill
  // that failed lets go. Forgetting the record lets go as well. A predecessor let go
  // by its last dependent rejoins the disk list at the cold end, where that record was.
  void hold_disk_predecessor(EntrySlot slot);
  void release_disk_predecessor(EntrySlot slot);
  // The entry leaves the index now (its disk copy failed verification, or an operator
  // evicted it); its slot and extent are freed with its last lease and I/O pin, and
  // an adopted entry's not before the adoption hold ends. The caller deletes the record.
  void kill(EntrySlot slot);

  void acquire_lease(EntrySlot slot);
  void release_lease(EntrySlot slot);
  void pin_io(EntrySlot slot);
  void unpin_io(EntrySlot slot);
  // A hit: count it and make it most recent. now_usec: coarse_monotonic_usec(), passed
  // in by callers touching many entries at once (0: read the clock here).
  void touch(EntrySlot slot, uint64_t now_usec = 0);
  // Host-evicts the entry the victim policy chooses (the least recently used when
  // none is set); false if nothing is evictable.
  bool evict_lru();
  void set_host_victim_policy(HostVictimPolicy policy) { victim_policy_ = policy; }
  // Unset: an entry costs its extent's bytes (fewest bytes evicted).
  void set_host_eviction_cost(HostEvictionCost cost) { eviction_cost_ = cost; }
  // Host evictions that made room for a new extent, and the bytes they freed; of
  // those, the evictions of the cheapest stretch for an extent larger than the victim.
  uint64_t room_evictions() const { return room_evictions_; }
  uint64_t room_eviction_bytes() const { return room_eviction_bytes_; }
  uint64_t run_evictions() const { return run_evictions_; }
  void evict_host(EntrySlot slot);  // host-evicts this evictable entry
  EntrySlot host_lru_tail() const { return order_.host_tail(); }
  EntrySlot host_lru_prev(EntrySlot slot) const { return order_.host_prev(slot); }
  // The coldest disk copy eviction may take (no_slot if none).
  EntrySlot disk_lru_tail() const { return order_.disk_tail(); }
  void count_disk_eviction() { ++disk_evictions_; }

  const Entry& entry(EntrySlot slot) const { return slots_.at(slot); }
  // Readable from the arena by clients now.
  bool host_readable(const Entry& e) const { return e.sealed && e.on_host && !e.promoting; }
  // Operator-visible ids: a slot and its reuse generation, so a stale id never
  // names a newer entry in the same slot.
  uint64_t entry_id(EntrySlot slot) const { return (uint64_t{generations_.at(slot)} << 32) | slot; }
  EntrySlot slot_for_id(uint64_t id) const;
  size_t slot_count() const { return slots_.size(); }  // iterate, skipping !in_use
  // A parked entry presented again with a stronger class or evidence keeps the
  // stronger of each (Present must not freeze what was first said about it).
  // True when anything changed.
  bool upgrade(EntrySlot slot, EntryClass entry_class, Evidence evidence);
  // Pinned entries are never evicted.
  void set_pinned(EntrySlot slot, bool pinned);
  uint64_t pinned() const { return pinned_; }

  uint64_t data_bytes() const { return allocator_.capacity_bytes(); }
  uint64_t bytes_free() const { return allocator_.bytes_free(); }
  uint64_t largest_free_bytes() const { return allocator_.largest_free_bytes(); }
  uint64_t evictable_bytes() const { return order_.evictable_bytes(); }
  uint64_t disk_bytes() const { return disk_bytes_; }
  uint64_t disk_entries() const { return disk_entries_; }
  uint64_t blocks() const { return sealed_blocks_; }
  uint64_t snapshots() const { return sealed_snapshots_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t disk_evictions() const { return disk_evictions_; }
  size_t slots_in_use() const { return slots_in_use_; }

 private:
  friend struct IndexImage;  // keeps the arrays across a restart (index_image.h)
  struct BlockKey {
    NamespaceIndex ns;
    Hash128 hash;
    bool operator==(const BlockKey&) const = default;
  };
  struct BlockKeyHasher {
    size_t operator()(const BlockKey& k) const noexcept { return Hash128Hasher{}(k.hash) ^ k.ns; }
  };

  bool host_evictable(const Entry& e) const {
    return host_readable(e) && !e.dead && e.leases == 0 && !e.pinned && e.io_pins == 0 &&
           !e.adoption_hold;
  }
  bool disk_evictable(const Entry& e) const {
    return e.sealed && !e.dead && e.on_disk && e.leases == 0 && !e.pinned &&
           e.io_pins == 0 && e.disk_dependents == 0;
  }
  // Puts the entry on, or takes it off, each eviction list as its state now
  // requires; `to_front` makes a listed entry the most recent.
  void sync_lists(EntrySlot slot, bool to_front) {
    const Entry& e = slots_[slot];
    order_.sync(slot, host_evictable(e), disk_evictable(e), to_front);
  }
  Status allocate_extent(uint64_t bytes, uint64_t& ret_offset);
  // Evicts the cheapest contiguous stretch of free space and evictable entries that
  // holds `bytes` (eviction_run.h); false, nothing evicted, when no stretch does.
  bool evict_cheapest_run(uint64_t bytes);
  void evict_for_room(EntrySlot slot);  // evict_host, counted as making room
  void drop_host_copy(EntrySlot slot);
  void forget_disk_copy(EntrySlot slot);
  // Replaces the entry's tail tokens with a copy of `tail` (none: frees them).
  static void set_tail(Entry& e, std::span<const int32_t> tail);
  // A slot holding the new entry, last used at last_use_usec (CLOCK_MONOTONIC_COARSE).
  EntrySlot new_slot(const NewEntry& n, uint64_t last_use_usec);
  // An adopted reservation's slot: dead (never indexed) and held, its extent claimed by
  // the caller (insert_adopted_reservation(), IndexImage).
  EntrySlot new_held_reservation(const NewEntry& n, uint64_t extent_offset, uint32_t record);
  void index(EntrySlot slot);
  void remove_from_index(EntrySlot slot);
  void free_slot(EntrySlot slot);
  // A dead entry's slot goes with its last lease and I/O pin; true if it is dead.
  bool free_if_dead_and_unused(EntrySlot slot);

  // A newly sealed entry in its namespace's and the table's counts.
  void count_sealed(const Entry& e);
  // Takes a sealed entry out of the counts (its host bytes go with its host copy).
  void uncount_sealed(const Entry& e);
  // The state record of an entry now readable on the host / about to leave it.
  void record_host_copy(EntrySlot slot);
  void forget_record(EntrySlot slot);

  HostVictimPolicy victim_policy_ = nullptr;
  HostEvictionCost eviction_cost_ = nullptr;
  uint64_t room_evictions_ = 0;
  uint64_t room_eviction_bytes_ = 0;
  uint64_t run_evictions_ = 0;
  EntryState* state_ = nullptr;
  uint64_t held_bytes_ = 0;
  uint64_t held_reservations_ = 0;
  shm::ExtentAllocator allocator_;
  // Between begin and finish_adoption. The claims, and blocks_, belong to the batch's
  // indexer until take_claimed_batch() has joined it.
  std::unique_ptr<shm::ExtentClaims> adoption_claims_;
  // Entries adopted and not yet claimed, in record order, and the blocks' keys.
  struct AdoptedExtent {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    EntrySlot slot = no_slot;
    bool block = false;
  };
  HugePageVector<BlockIndex::Key> adoption_blocks_;
  HugePageVector<AdoptedExtent> adoption_extents_;
  // The batch before: indexed into blocks_ and claimed by indexer_, on a core of its
  // own, while the next one is adopted (a cache miss a key, overlapped with the records'
  // own). It reads these and the claims, never the slab: the slots it refuses are
  // undone on this thread.
  HugePageVector<BlockIndex::Key> indexing_blocks_;
  HugePageVector<AdoptedExtent> indexing_extents_;
  std::vector<EntrySlot> indexing_refused_;
  std::thread indexer_;
  // Between begin_adoption() and the first batch's indexing (on indexer_, or in line
  // when no thread could start), which joins it: blocks_ belongs to it till then.
  std::thread cells_writer_;
  Refused adoption_refused_;
  // Waits for the batch before and starts indexing and claiming the entries adopted
  // since: on indexer_, or in line for the `last` batch or when no thread can start.
  void hand_over_adopted_batch(bool last);
  // The indexer's work: indexes the batch's blocks, then claims every extent in record
  // order, taking out a block whose key or extent is taken and refusing a snapshot
  // whose extent is (indexing_refused_).
  void index_and_claim_batch();
  // Waits for the batch being indexed and undoes the entries it refused.
  void take_claimed_batch();
  std::vector<NamespaceInfo> namespaces_;
  std::unordered_map<NamespaceId, NamespaceIndex, Hash128Hasher> namespace_by_id_;
  // Slots in use (any kind: reserved, sealed, dead, disk-only) by namespace: an index
  // holding none may be reused (register_namespace).
  std::vector<uint64_t> namespace_slots_;
  uint64_t namespaces_reused_ = 0;
  // The slab, its generations and the block index are the table's bulk (about 250
  // bytes an entry): on huge pages, so building them for 1M entries at adoption is not
  // a million page faults (huge_page_allocator.h).
  HugePageVector<Entry> slots_;
  HugePageVector<uint32_t> generations_;  // bumped when a slot is freed
  HugePageVector<EntrySlot> free_slots_;
  EvictionOrder order_{slots_};
  BlockIndex blocks_;
  std::unordered_map<BlockKey, std::vector<EntrySlot>, BlockKeyHasher> snapshots_;  // by anchor
  uint64_t disk_bytes_ = 0;
  uint64_t disk_entries_ = 0;
  uint64_t tick_ = 0;
  uint64_t sealed_blocks_ = 0;
  uint64_t sealed_snapshots_ = 0;
  uint64_t evictions_ = 0;
  uint64_t disk_evictions_ = 0;
  uint64_t pinned_ = 0;
  size_t slots_in_use_ = 0;
};

}  // namespace kvpark::daemon
