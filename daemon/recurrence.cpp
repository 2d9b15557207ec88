// Recurrence detection (see recurrence.h).
#include "daemon/recurrence.h"

#include "proto/limits.h"

namespace kvpark::daemon {

uint32_t Recurrence::observe(NamespaceIndex ns, std::span<const Hash128> chunk_hashes,
                             uint64_t session_id, uint32_t restorable_tokens,
                             uint32_t chain_tokens) {
  uint32_t hint = 0;
  const size_t first = restorable_tokens / chain_tokens;
  for (size_t j = first; j < chunk_hashes.size(); ++j) {
    const Hash128& h = chunk_hashes[j];
    auto [it, inserted] = seen_.try_emplace(h, Seen{.session_id = session_id});
    if (inserted) {
      // Bounded memory: forget the oldest chunk once the ring is full.
      if (order_.size() < limits::recurrence_chunks_max) {
        order_.push_back(h);
      } else {
        seen_.erase(order_[next_]);
        order_[next_] = h;
        next_ = (next_ + 1) % limits::recurrence_chunks_max;
      }
      continue;
    }
    if (it->second.session_id != session_id) it->second.recurring = true;
    const uint32_t position = static_cast<uint32_t>((j + 1) * chain_tokens);
    // A snapshot parked or being written within this chunk already captures the head
    // (an engine's own frontier need not fall on a chunk boundary): no second one.
    if (it->second.recurring && position >= restorable_tokens + recurrence_tokens_min &&
        table_.snapshots_at(ns, h).empty()) {
      hint = position;  // the deepest chunk two sessions share
    }
  }
  return hint;
}

}  // namespace kvpark::daemon
