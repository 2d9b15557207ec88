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
  // Brings the key's first probe into the cache (a later find or insert of it).
  void prefetch(NamespaceIndex ns, const Hash128& hash) const {
    if (!cells_.empty()) __builtin_prefetch(&cells_[home(ns, hash)]);
  }
  size_t size() const { return size_; }
  size_t capacity() const { return cells_.size(); }

  static constexpr size_t cell_bytes = 32;  // per cell; at most two cells a key

 private:
  struct Cell {
    Hash128 hash;
    NamespaceIndex ns = 0;
    EntrySlot slot = no_slot;  // no_slot: empty
    uint64_t pad = 0;          // 32 bytes: a cell never straddles a cache line
  };
  static_assert(sizeof(Cell) == cell_bytes);

  size_t home(NamespaceIndex ns, const Hash128& hash) const;
  // The cell holding the key, or the empty cell ending its run.
  size_t probe(NamespaceIndex ns, const Hash128& hash) const;
  void grow_to(size_t cells);

  HugePageVector<Cell> cells_;
  size_t mask_ = 0;
  size_t size_ = 0;
  uint64_t seed_low_ = 0, seed_high_ = 0;
};

}  // namespace kvpark::daemon
