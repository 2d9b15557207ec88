// LOOKUP and WAIT: finding the longest restorable prefix and leasing it, step by
// step; what is only on disk is promoted as it is leased (disk_mover.h), what
// another engine is writing is noted for single flight (single_flight.h), and the
// chunks past the prefix feed recurrence detection (recurrence.h).
#include <algorithm>
#include <cassert>

#include "daemon/clock.h"
#include "daemon/park.h"
#include "proto/limits.h"

namespace kvpark::daemon {

Status Park::lookup(ConnectionId id, const wire::LookupRequest& req, wire::LookupReply& ret) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  if (Status s = check_lookup(*c, req); s != Status::Ok) return s;
  const NamespaceInfo& info = table_.namespace_info(c->ns);
  // Everything found is leased at once: promoting a later entry may evict from the
  // host, and must not evict what this lookup already chose.
  Lease lease{.ns = c->ns, .session_id = req.session_id, .prompt_tokens = req.prompt_tokens};
  lease_blocks(req, lease);
  const uint32_t block_restorable =
      info.geometry.snapshot_required
          ? 0
          : static_cast<uint32_t>(lease.blocks.size() * info.geometry.block_tokens);
  single_flight_.note_inflight_blocks(id, req, info.geometry.block_tokens, lease);
  lease_snapshots(id, req, block_restorable, lease);
  if (info.geometry.snapshot_required) trim_to_snapshots(lease);
  // Past the local chain: ask the remote tier, if any (remote_mover.h).
  const RemoteMover::Probe remote_probe = remote_.should_probe(c->ns, req, lease);

  ++counters_.lookups;
  const uint64_t now = coarse_monotonic_usec();
  for (auto it = lease.snapshots.rbegin(); it != lease.snapshots.rend(); ++it) {
    table_.touch(*it, now);
  }
  for (auto it = lease.blocks.rbegin(); it != lease.blocks.rend(); ++it) table_.touch(*it, now);
  uint32_t restorable = block_restorable;
  for (EntrySlot slot : lease.snapshots) restorable = std::max(restorable, table_.entry(slot).position);
  lease.capture_hint_tokens =
      recurrence_.observe(c->ns, req.chunk_hashes, req.session_id, restorable, info.chain_tokens);
  uint64_t lease_id = 0;
  if (!lease.blocks.empty() || !lease.snapshots.empty() || !lease.inflight.empty() ||
      remote_probe != RemoteMover::Probe::none) {
    lease_id = next_lease_id_++;
    ++leases_open_;
  }
  if (remote_probe != RemoteMover::Probe::none)
    remote_.start_probe(remote_probe, id, lease_id, c->ns, req, lease);
  describe_lease(table_, lease_id, lease, ret);
  count_lookup(lease, lease_id == 0, &ret);
  if (lease_id != 0) c->leases.emplace(lease_id, std::move(lease));
  return Status::Ok;
}

Status Park::check_lookup(const Connection& c, const wire::LookupRequest& req) const {
  const uint32_t chain = table_.namespace_info(c.ns).chain_tokens;
  if (req.prompt_tokens > limits::lookup_tokens_max) return Status::LimitExceeded;
  if (req.prompt_tokens == 0 || req.tail_tokens.size() >= chain ||
      uint64_t{req.chunk_hashes.size()} * chain + req.tail_tokens.size() != req.prompt_tokens) {
    return Status::InvalidArgument;
  }
  if (c.leases.size() >= limits::leases_per_connection_max) return Status::LimitExceeded;
  return Status::Ok;
}

bool Park::lease_usable(EntrySlot slot) {
  if (slot == no_slot || !table_.entry(slot).sealed) return false;
  const Entry& e = table_.entry(slot);
  if (e.on_host) return true;
  // On disk only: bring it in, if reading it is faster than recomputing it.
  if (!disk_.policy().load_beats_recompute(e, table_.namespace_info(e.ns))) {
    ++counters_.recompute_instead;
    return false;
  }
  return start_promotion(slot);
}

void Park::lease_blocks(const wire::LookupRequest& req, Lease& lease) {
  const NamespaceInfo& info = table_.namespace_info(lease.ns);
  const uint32_t block_tokens = info.geometry.block_tokens;
  if (block_tokens == 0) return;
  // Where a snapshot decides what is restorable, disk-only blocks are promoted only
  // once it is known how many of them the chosen snapshot needs (trim_to_snapshots).
  const bool snapshot_required = info.geometry.snapshot_required;
  const size_t blocks_max = (req.prompt_tokens - 1) / block_tokens;
  for (size_t i = 0; i < std::min(req.chunk_hashes.size(), blocks_max); ++i) {
    const EntrySlot slot = table_.find_block(lease.ns, req.chunk_hashes[i]);
    const bool present = slot != no_slot && table_.entry(slot).sealed;
    if (snapshot_required ? !present : !lease_usable(slot)) break;
    table_.acquire_lease(slot);
    lease.blocks.push_back(slot);
  }
}

void Park::lease_snapshots(ConnectionId id, const wire::LookupRequest& req,
                           uint32_t block_restorable, Lease& lease) {
  const NamespaceInfo& info = table_.namespace_info(lease.ns);
  const size_t chunks = req.chunk_hashes.size();
  // Tails past the last whole chunk are checked here; earlier tails are confirmed by
  // the client.
  const size_t anchor_max = info.geometry.block_tokens > 0 ? lease.blocks.size() : chunks;
  // Most attention-only namespaces never park a snapshot: skip one probe per chunk.
  if (info.indexed_snapshots == 0) return;
  for (size_t j = anchor_max + 1; j-- > 0;) {
    if (lease.snapshots.size() >= limits::lookup_snapshot_candidates_max) break;
    const Hash128& anchor = j == 0 ? info.id : req.chunk_hashes[j - 1];
    std::vector<EntrySlot> here;
    for (EntrySlot slot : table_.snapshots_at(lease.ns, anchor)) {
      const Entry& e = table_.entry(slot);
      if (e.position >= req.prompt_tokens || e.position <= block_restorable) continue;
      if (!e.sealed) {
        // Another engine is writing a snapshot here: single flight for snapshot engines.
        if (j < chunks) single_flight_.note_inflight_snapshot(id, slot, block_restorable, lease);
        continue;
      }
      if (j == chunks &&
          !std::equal(e.tail_tokens.begin(), e.tail_tokens.end(), req.tail_tokens.begin(),
                      req.tail_tokens.begin() +
                          std::min(e.tail_tokens.size(), req.tail_tokens.size()))) {
        continue;
      }
      here.push_back(slot);
    }
    std::sort(here.begin(), here.end(), [&](EntrySlot a, EntrySlot b) {
      return table_.entry(a).position > table_.entry(b).position;
    });
    for (EntrySlot slot : here) {
      if (lease.snapshots.size() >= limits::lookup_snapshot_candidates_max) break;
      if (!lease_usable(slot)) continue;
      table_.acquire_lease(slot);
      lease.snapshots.push_back(slot);
    }
  }
}

void Park::trim_to_snapshots(Lease& lease) {
  size_t needed = 0;
  for (EntrySlot slot : lease.snapshots) {
    needed = std::max<size_t>(needed, table_.entry(slot).anchor_chunks);
  }
  // Now bring in the disk-only blocks the snapshots need; where that fails, the
  // chain (and every snapshot anchored past it) ends.
  for (size_t i = 0; i < needed && i < lease.blocks.size(); ++i) {
    if (!table_.entry(lease.blocks[i]).on_host && !lease_usable(lease.blocks[i])) needed = i;
  }
  while (lease.blocks.size() > needed) {
    table_.release_lease(lease.blocks.back());
    lease.blocks.pop_back();
  }
  std::erase_if(lease.snapshots, [&](EntrySlot slot) {
    if (table_.entry(slot).anchor_chunks <= needed) return false;
    table_.release_lease(slot);
    return true;
  });
}

void Park::count_lookup(Lease& lease, bool ended, const wire::LookupReply* described) {
  if (lease.counted) return;
  const bool settled = lease_settled(table_, lease);
  if (!settled && !ended) return;
  lease.counted = true;
  wire::LookupReply own;
  if (described == nullptr) describe_lease(table_, 0, lease, own);
  const wire::LookupReply& now = described != nullptr ? *described : own;
  uint32_t deepest = now.restorable_tokens;
  ReuseKind deepest_kind = static_cast<ReuseKind>(now.reuse_kind);
  if (!settled && deepest > 0) {  // blocks still being promoted were never restorable
    const uint32_t block_tokens = table_.namespace_info(lease.ns).geometry.block_tokens;
    deepest = now.host_blocks * block_tokens;
    deepest_kind =
        now.host_blocks > 0
            ? reuse_kind_of(table_.entry(lease.blocks[now.host_blocks - 1]), lease.session_id)
            : ReuseKind::Root;
  }
  for (const wire::SnapshotCandidate& s : now.snapshots) {
    if (s.position > deepest && (settled || s.ready != 0)) {
      deepest = s.position;
      deepest_kind = static_cast<ReuseKind>(s.reuse_kind);
    }
  }
  counters_.lookup_hit_tokens += deepest;
  table_.count_tokens(lease.ns, deepest, 0);
  ++counters_.reuse[static_cast<size_t>(deepest_kind)];
}

bool Park::wait(ConnectionId id, uint32_t sequence, const wire::WaitRequest& req,
                Status& ret_status, wire::LookupReply& ret) {
  Connection* c = greeted(id);
  ret_status = Status::Ok;
  if (c == nullptr) {
    ret_status = Status::BadState;
    return true;
  }
  auto it = c->leases.find(req.lease_id);
  if (it == c->leases.end()) {
    ret_status = Status::NotFound;
    return true;
  }
  if (req.timeout_msec > limits::wait_timeout_msec_max) {
    ret_status = Status::InvalidArgument;
    return true;
  }
  const bool settled = lease_settled(table_, it->second);
  if (settled || req.timeout_msec == 0) {
    describe_lease(table_, req.lease_id, it->second, ret);
    count_lookup(it->second, false, &ret);
    ret_status = settled ? Status::Ok : Status::Timeout;
    return true;
  }
  ret_status = single_flight_.enqueue(id, sequence, req.lease_id, it->second, req.timeout_msec,
                                      table_.namespace_info(c->ns).prefill_tokens_per_second);
  return ret_status != Status::Ok;
}

void Park::answer_waiters(bool expire_only) {
  single_flight_.answer(
      expire_only,
      [this](ConnectionId id, uint64_t lease_id, Lease*& ret_lease) {
        auto conn = connections_.find(id);
        if (conn == connections_.end()) return false;
        auto lease = conn->second.leases.find(lease_id);
        ret_lease = lease == conn->second.leases.end() ? nullptr : &lease->second;
        return true;
      },
      [this](Lease& lease, const wire::LookupReply& reply) { count_lookup(lease, false, &reply); },
      reply_sink_);
}

}  // namespace kvpark::daemon
