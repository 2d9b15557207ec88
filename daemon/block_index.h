// The block index: (namespace, chain hash) -> entry slot, as an open-addressing hash
// table with linear probing over one flat array (on huge pages).
//
// Why not std::unordered_map: a node-based map costs two or three cache misses per
// lookup (bucket, the node before, the node) and an allocation per insert; rebuilding
// 1M entries at adoption spent most of its time there. Here a lookup is one probe
// sequence in one array, usually one cache line, and a caller that knows its next
// keys (adoption) prefetches them.
//
// Chain hashes come from clients, so the probe position mixes the key with a seed
// drawn per table: nobody can choose keys that pile onto one run. Load stays at most
// 1/2; deletion shifts the run back, so there are no tombstones.
// Single-threaded, like the entry table that owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "daemon/entry.h"
#include "daemon/huge_page_allocator.h"
#include "proto/types.h"

namespace kvpark::daemon {

class BlockIndex {
 public:
  BlockIndex();

  EntrySlot find(NamespaceIndex ns, const Hash128& hash) const;
  // Adds the key; false if it is already there (nothing changes).
  bool insert(NamespaceIndex ns, const Hash128& hash, EntrySlot slot);
  // Points an existing key at another slot; false if the key is not there.
  bool assign(NamespaceIndex ns, const Hash128& hash, EntrySlot slot);
  bool erase(NamespaceIndex ns, const Hash128& hash);
  // Room for `keys` keys without growing.
  void reserve(size_t keys);
  // Adoption's bulk insert: the keys go in by the order of their home cells (a stable
  // bucket sort on the top bits), so the cells are written front to back instead of
  // at random: the cells of 1M keys are 64 MB, a cache and TLB miss per key otherwise.
  // A key already there, or given twice, keeps its first slot (by position in `keys`);
  // the slots of the others are appended to ret_refused.
  struct Key {
    Hash128 hash;
    NamespaceIndex ns = 0;
    EntrySlot slot = no_slot;
  };
  void insert_batch(std::span<const Key> keys, std::vector<EntrySlot>& ret_refused);
  size_t size() const { return size_; }
  size_t capacity() const { return cells_.size(); }

  static constexpr size_t cell_bytes = 32;  // per cell; at most two cells a key

 private:
  friend struct IndexImage;  // keeps the cells and seeds across a restart (index_image.h)
  struct Cell {
    Hash128 hash;
    NamespaceIndex ns = 0;
    EntrySlot slot = no_slot;  // no_slot: empty
    uint64_t pad = 0;          // 32 bytes: a cell never straddles a cache line
  };
  static_assert(sizeof(Cell) == cell_bytes);

  size_t home(NamespaceIndex ns, const Hash128& hash) const;
  // The cell holding the key, or the empty cell ending its run (from its home).
  size_t probe(NamespaceIndex ns, const Hash128& hash) const {
    return probe_from(home(ns, hash), ns, hash);
  }
  size_t probe_from(size_t home, NamespaceIndex ns, const Hash128& hash) const;
  void grow_to(size_t cells);

  HugePageVector<Cell> cells_;
  size_t mask_ = 0;
  size_t size_ = 0;
  uint64_t seed_low_ = 0, seed_high_ = 0;
};

}  // namespace kvpark::daemon
