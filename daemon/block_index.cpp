// The block index (see block_index.h).
#include "daemon/block_index.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <utility>

namespace kvpark::daemon {
namespace {

constexpr size_t cells_min = 16;
// insert_batch() sorts into this many buckets (as bits): 2048 runs of the cells, each
// small enough to stay in the cache while its keys go in.
constexpr unsigned batch_bucket_bits = 11;

uint64_t random_seed() {
  uint64_t seed = 0;
  if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof seed)) return seed;
  // Early boot without entropy: still different per process and start.
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_nsec) * 0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(getpid());
}

}  // namespace

BlockIndex::BlockIndex() : seed_low_(random_seed()), seed_high_(random_seed()) {}

size_t BlockIndex::home(NamespaceIndex ns, const Hash128& hash) const {
  uint64_t x = (hash.low ^ seed_low_) * 0x9e3779b97f4a7c15ull;
  x ^= (hash.high ^ seed_high_ ^ ns) * 0xc2b2ae3d27d4eb4full;
  x ^= x >> 29;
  return static_cast<size_t>(x) & mask_;
}

size_t BlockIndex::probe_from(size_t start, NamespaceIndex ns, const Hash128& hash) const {
  assert(!cells_.empty());
  for (size_t i = start;; i = (i + 1) & mask_) {
    const Cell& c = cells_[i];
    if (c.slot == no_slot || (c.hash == hash && c.ns == ns)) return i;
  }
}

EntrySlot BlockIndex::find(NamespaceIndex ns, const Hash128& hash) const {
  if (size_ == 0) return no_slot;
  return cells_[probe(ns, hash)].slot;
}

bool BlockIndex::insert(NamespaceIndex ns, const Hash128& hash, EntrySlot slot) {
  assert(slot != no_slot);
  if ((size_ + 1) * 2 > cells_.size()) grow_to(std::max(cells_min, cells_.size() * 2));
  Cell& c = cells_[probe(ns, hash)];
  if (c.slot != no_slot) return false;
  c = Cell{.hash = hash, .ns = ns, .slot = slot};
  ++size_;
  return true;
}

bool BlockIndex::assign(NamespaceIndex ns, const Hash128& hash, EntrySlot slot) {
  assert(slot != no_slot);
  if (size_ == 0) return false;
  Cell& c = cells_[probe(ns, hash)];
  if (c.slot == no_slot) return false;
  c.slot = slot;
  return true;
}

bool BlockIndex::erase(NamespaceIndex ns, const Hash128& hash) {
  if (size_ == 0) return false;
  size_t hole = probe(ns, hash);
  if (cells_[hole].slot == no_slot) return false;
  // Backward shift: each later cell of the run whose home does not lie cyclically in
  // (hole, at] moves into the hole, so every key stays reachable from its home.
  for (size_t at = (hole + 1) & mask_; cells_[at].slot != no_slot; at = (at + 1) & mask_) {
    const size_t want = home(cells_[at].ns, cells_[at].hash);
    const bool stays = hole <= at ? (want > hole && want <= at) : (want > hole || want <= at);
    if (stays) continue;
    cells_[hole] = cells_[at];
    hole = at;
  }
  cells_[hole] = Cell{};
  --size_;
  return true;
}

void BlockIndex::insert_batch(std::span<const Key> keys, std::vector<EntrySlot>& ret_refused) {
  reserve(size_ + keys.size());
  assert(cells_.size() <= (size_t{1} << 32) && "homes are kept in 32 bits");
  const unsigned cell_bits = static_cast<unsigned>(std::countr_zero(cells_.size()));
  const unsigned shift = cell_bits - std::min(cell_bits, batch_bucket_bits);
  std::vector<uint32_t> homes(keys.size());
  std::vector<uint32_t> starts((size_t{1} << (cell_bits - shift)) + 1, 0);
  for (size_t i = 0; i < keys.size(); ++i) {
    homes[i] = static_cast<uint32_t>(home(keys[i].ns, keys[i].hash));
    ++starts[(homes[i] >> shift) + 1];
  }
  for (size_t b = 1; b < starts.size(); ++b) starts[b] += starts[b - 1];
  std::vector<uint32_t> order(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    order[starts[homes[i] >> shift]++] = static_cast<uint32_t>(i);
  // The keys' probes are independent: fetching the cell of the key `ahead` places on
  // overlaps their cache misses instead of taking them one at a time.
  constexpr size_t ahead = 16;
  for (size_t j = 0; j < order.size(); ++j) {
    if (j + ahead < order.size()) __builtin_prefetch(&cells_[homes[order[j + ahead]]], 1);
    const uint32_t i = order[j];
    const Key& k = keys[i];
    assert(k.slot != no_slot);
    Cell& c = cells_[probe_from(homes[i], k.ns, k.hash)];
    if (c.slot != no_slot) {
      ret_refused.push_back(k.slot);
      continue;
    }
    c = Cell{.hash = k.hash, .ns = k.ns, .slot = k.slot};
    ++size_;
  }
}

void BlockIndex::reserve(size_t keys) {
  size_t cells = cells_min;
  while (cells < keys * 2) cells *= 2;
  if (cells > cells_.size()) grow_to(cells);
}

void BlockIndex::grow_to(size_t cells) {
  assert((cells & (cells - 1)) == 0 && cells >= size_ * 2);
  HugePageVector<Cell> old(cells);
  std::swap(old, cells_);
  mask_ = cells - 1;
  for (const Cell& c : old) {
    if (c.slot == no_slot) continue;
    cells_[probe(c.ns, c.hash)] = c;
  }
}

}  // namespace kvpark::daemon
