// Single flight and WAIT (DESIGN.md §5): when several requests need the same
// uncached prefix, one engine prefills and publishes it while the others wait.
//
// A LOOKUP that stops where another connection holds the next entries reserved
// notes them in its lease (note_inflight_*). A WAIT on a lease that is not settled
// (lease.h: promotions in flight, in-flight entries not sealed) is queued here and
// answered through the reply sink when the lease settles — an entry sealed, aborted
// or dropped with its writer's connection — or at its deadline with what is ready
// (Timeout). A follower never waits longer than prefilling the in-flight tokens
// itself would take at its namespace's declared rate. Loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "daemon/lease.h"
#include "proto/limits.h"
#include "proto/status.h"
#include "proto/wire.h"

namespace kvpark::daemon {

class SingleFlight {
 public:
  using ReplySink = std::function<void(ConnectionId, std::vector<uint8_t>&&)>;
  // The lease a waiter waits on in ret_lease (null when it is gone); false when its
  // connection is gone.
  using FindLease = std::function<bool(ConnectionId, uint64_t lease_id, Lease*& ret_lease)>;
  // Each lease a wait is answered on, with the reply that describes it.
  using Answered = std::function<void(Lease&, const wire::LookupReply&)>;

  explicit SingleFlight(const EntryTable& table) : table_(table) {}

  // Blocks right after the lease's prefix that another connection is writing now,
  // up to the last block that leaves a token to prefill.
  void note_inflight_blocks(ConnectionId id, const wire::LookupRequest& req,
                            uint32_t block_tokens, Lease& lease) const;
  // A snapshot another connection is writing past the restorable blocks: the first
  // one a lookup meets is what its snapshot engine waits for.
  void note_inflight_snapshot(ConnectionId id, EntrySlot slot, uint32_t block_restorable,
                              Lease& lease) const;

  // Queues a WAIT on an unsettled lease for at most timeout_msec (shortened to the
  // in-flight tokens' prefill time at prefill_tokens_per_second, when declared).
  // LimitExceeded when limits::waits_max are pending, or waits_per_connection_max of id's.
  Status enqueue(ConnectionId id, uint32_t sequence, uint64_t lease_id, const Lease& lease,
                 uint32_t timeout_msec, uint32_t prefill_tokens_per_second);
  // A closed connection's waits go unanswered.
  void forget(ConnectionId id);
  // Answers every wait whose lease settled (with expire_only, only those whose
  // deadline passed, settled or not), through `sink`, telling `answered` first.
  void answer(bool expire_only, const FindLease& find, const Answered& answered,
              const ReplySink& sink);
  size_t pending() const { return waiters_.size(); }

 private:
  struct Waiter {
    ConnectionId connection = 0;
    uint32_t sequence = 0;
    uint64_t lease_id = 0;
    uint64_t deadline_usec = 0;  // CLOCK_MONOTONIC
  };

  const EntryTable& table_;
  std::vector<Waiter> waiters_;
};

}  // namespace kvpark::daemon
