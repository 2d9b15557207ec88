// The block index (see block_index.h).
#include "daemon/block_index.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <utility>

namespace kvpark::daemon {
namespace {

constexpr size_t cells_min = 16;

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

size_t BlockIndex::probe(NamespaceIndex ns, const Hash128& hash) const {
  assert(!cells_.empty());
  for (size_t i = home(ns, hash);; i = (i + 1) & mask_) {
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
