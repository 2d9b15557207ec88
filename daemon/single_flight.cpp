// Single flight: in-flight entries of a lookup, and the WAITs on them (see
// single_flight.h).
#include "daemon/single_flight.h"

#include <algorithm>
#include <cstring>

#include "daemon/clock.h"

namespace kvpark::daemon {

void SingleFlight::note_inflight_blocks(ConnectionId id, const wire::LookupRequest& req,
                                        uint32_t block_tokens, Lease& lease) const {
  if (block_tokens == 0) return;
  const size_t blocks_max = (req.prompt_tokens - 1) / block_tokens;
  for (size_t i = lease.blocks.size(); i < std::min(req.chunk_hashes.size(), blocks_max); ++i) {
    const EntrySlot slot = table_.find_block(lease.ns, req.chunk_hashes[i]);
    if (slot == no_slot || table_.entry(slot).sealed || table_.entry(slot).reserved_by == id) {
      break;
    }
    lease.inflight.emplace_back(slot, table_.entry_id(slot));
    lease.inflight_tokens += block_tokens;
  }
}

void SingleFlight::note_inflight_snapshot(ConnectionId id, EntrySlot slot,
                                          uint32_t block_restorable, Lease& lease) const {
  const Entry& e = table_.entry(slot);
  if (e.reserved_by == id || !lease.inflight.empty()) return;
  lease.inflight.emplace_back(slot, table_.entry_id(slot));
  lease.inflight_tokens = e.position - block_restorable;
}

Status SingleFlight::enqueue(ConnectionId id, uint32_t sequence, uint64_t lease_id,
                             const Lease& lease, uint32_t timeout_msec,
                             uint32_t prefill_tokens_per_second) {
  if (waiters_.size() >= limits::waits_max) return Status::LimitExceeded;
  const auto own = std::count_if(waiters_.begin(), waiters_.end(),
                                 [id](const Waiter& w) { return w.connection == id; });
  if (static_cast<size_t>(own) >= limits::waits_per_connection_max) return Status::LimitExceeded;
  uint64_t timeout_usec = uint64_t{timeout_msec} * 1000;
  // A follower never waits longer than prefilling the in-flight part itself would take.
  const uint32_t rate = prefill_tokens_per_second;
  if (rate > 0 && !lease.inflight.empty()) {
    timeout_usec = std::min(timeout_usec, uint64_t{lease.inflight_tokens} * 1'000'000 / rate);
  }
  waiters_.push_back({.connection = id,
                      .sequence = sequence,
                      .lease_id = lease_id,
                      .deadline_usec = monotonic_usec() + timeout_usec});
  return Status::Ok;
}

void SingleFlight::forget(ConnectionId id) {
  std::erase_if(waiters_, [id](const Waiter& w) { return w.connection == id; });
}

void SingleFlight::answer(bool expire_only, const FindLease& find, const Answered& answered,
                          const ReplySink& sink) {
  const uint64_t now = monotonic_usec();
  std::vector<Waiter> waiting;
  waiting.swap(waiters_);
  for (const Waiter& w : waiting) {
    Lease* lease = nullptr;
    if (!find(w.connection, w.lease_id, lease)) continue;  // its connection closed
    Status status = Status::Ok;
    wire::LookupReply reply;
    if (lease == nullptr) {
      status = Status::NotFound;  // released under its own WAIT: a client bug
    } else if (!expire_only && lease_settled(table_, *lease)) {
      describe_lease(table_, w.lease_id, *lease, reply);
    } else if (now >= w.deadline_usec || lease_settled(table_, *lease)) {
      describe_lease(table_, w.lease_id, *lease, reply);
      status = lease_settled(table_, *lease) ? Status::Ok : Status::Timeout;
    } else {
      waiters_.push_back(w);
      continue;
    }
    std::vector<uint8_t> frame;
    if (status == Status::Ok || status == Status::Timeout) {
      if (answered) answered(*lease, reply);
      wire::encode(wire::Verb::Wait, reply, w.sequence, frame);
      const auto code = static_cast<uint16_t>(status);
      std::memcpy(frame.data() + 2, &code, sizeof code);
    } else {
      wire::encode(static_cast<uint16_t>(wire::Verb::Wait) | wire::reply_bit,
                   static_cast<uint16_t>(status), w.sequence, frame);
    }
    if (sink) sink(w.connection, std::move(frame));
  }
}

}  // namespace kvpark::daemon
