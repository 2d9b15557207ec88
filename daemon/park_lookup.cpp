// LOOKUP and WAIT: finding the longest restorable prefix, leasing it, promoting what
// is only on disk, single flight (prefixes another engine is writing) and recurrence
// hints (see park.h).
#include <algorithm>
#include <cassert>
#include <cstring>
#include <ctime>

#include "daemon/clock.h"
#include "daemon/park.h"
#include "proto/limits.h"

namespace kvpark::daemon {
Status Park::lookup(ConnectionId id, const wire::LookupRequest& req, wire::LookupReply& ret) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  const NamespaceInfo& info = table_.namespace_info(c->ns);
  const uint32_t chain = info.chain_tokens;
  const uint32_t block_tokens = info.geometry.block_tokens;
  const size_t chunks = req.chunk_hashes.size();
  if (req.prompt_tokens > limits::lookup_tokens_max) return Status::LimitExceeded;
  if (req.prompt_tokens == 0 || req.tail_tokens.size() >= chain ||
      uint64_t{chunks} * chain + req.tail_tokens.size() != req.prompt_tokens) {
    return Status::InvalidArgument;
  }
  if (c->leases.size() >= limits::leases_per_connection_max) return Status::LimitExceeded;

  // Everything found is leased at once: promoting a later entry may evict from the
  // host, and must not evict what this lookup already chose.
  Lease lease{.session_id = req.session_id, .prompt_tokens = req.prompt_tokens};
  auto usable = [&](EntrySlot slot) {
    if (slot == no_slot || !table_.entry(slot).sealed) return false;
    const Entry& e = table_.entry(slot);
    if (e.on_host) return true;
    // On disk only: bring it in, if reading it is faster than recomputing it.
    if (!load_beats_recompute(e)) {
      ++counters_.recompute_instead;
      return false;
    }
    return start_promotion(slot);
  };
  const bool snapshot_required = info.geometry.snapshot_required;
  // Longest run of sealed blocks, leaving at least one token to prefill. Where a
  // snapshot decides what is restorable, disk-only blocks are promoted only once
  // it is known how many of them the chosen snapshot needs.
  if (block_tokens > 0) {
    const size_t blocks_max = (req.prompt_tokens - 1) / block_tokens;
    for (size_t i = 0; i < std::min(chunks, blocks_max); ++i) {
      const EntrySlot slot = table_.find_block(c->ns, req.chunk_hashes[i]);
      const bool present = slot != no_slot && table_.entry(slot).sealed;
      if (snapshot_required ? !present : !usable(slot)) break;
      table_.acquire_lease(slot);
      lease.blocks.push_back(slot);
    }
  }
  const uint32_t block_restorable =
      snapshot_required ? 0 : static_cast<uint32_t>(lease.blocks.size() * block_tokens);
  // Single flight: blocks right after the prefix that another engine is writing now.
  if (block_tokens > 0) {
    const size_t blocks_max = (req.prompt_tokens - 1) / block_tokens;
    for (size_t i = lease.blocks.size(); i < std::min(chunks, blocks_max); ++i) {
      const EntrySlot slot = table_.find_block(c->ns, req.chunk_hashes[i]);
      if (slot == no_slot || table_.entry(slot).sealed || table_.entry(slot).reserved_by == id) {
        break;
      }
      lease.inflight.emplace_back(slot, table_.entry_id(slot));
      lease.inflight_tokens += block_tokens;
    }
  }

  // Snapshots deeper than the block prefix, deepest anchor first. Tails past the
  // last whole chunk are checked here; earlier tails are confirmed by the client.
  const size_t anchor_max = block_tokens > 0 ? lease.blocks.size() : chunks;
  // Most attention-only namespaces never park a snapshot: skip one probe per chunk.
  const bool any_snapshots = info.indexed_snapshots > 0;
  for (size_t j = anchor_max + 1; any_snapshots && j-- > 0;) {
    if (lease.snapshots.size() >= limits::lookup_snapshot_candidates_max) break;
    const Hash128& anchor = j == 0 ? info.id : req.chunk_hashes[j - 1];
    std::vector<EntrySlot> here;
    for (EntrySlot slot : table_.snapshots_at(c->ns, anchor)) {
      const Entry& e = table_.entry(slot);
      if (e.position >= req.prompt_tokens || e.position <= block_restorable) continue;
      if (!e.sealed) {
        // Another engine is writing a snapshot here: single flight for snapshot engines.
        if (e.reserved_by != id && lease.inflight.empty() && j < chunks) {
          lease.inflight.emplace_back(slot, table_.entry_id(slot));
          lease.inflight_tokens = e.position - block_restorable;
        }
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
      if (!usable(slot)) continue;
      table_.acquire_lease(slot);
      lease.snapshots.push_back(slot);
    }
  }
  if (snapshot_required) {
    // Blocks only matter up to the deepest candidate's anchor.
    size_t needed = 0;
    for (EntrySlot slot : lease.snapshots) {
      needed = std::max<size_t>(needed, table_.entry(slot).anchor_chunks);
    }
    // Now bring in the disk-only blocks the snapshots need; where that fails, the
    // chain (and every snapshot anchored past it) ends.
    for (size_t i = 0; i < needed && i < lease.blocks.size(); ++i) {
      if (!table_.entry(lease.blocks[i]).on_host && !usable(lease.blocks[i])) needed = i;
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

  // Past the local chain: ask the remote tier, if any (park_remote.cpp).
  const bool remote_probe = remote_should_probe(*c, req, lease);

  ++counters_.lookups;
  const uint64_t now = coarse_monotonic_usec();
  for (auto it = lease.snapshots.rbegin(); it != lease.snapshots.rend(); ++it) {
    table_.touch(*it, now);
  }
  for (auto it = lease.blocks.rbegin(); it != lease.blocks.rend(); ++it) table_.touch(*it, now);
  uint32_t restorable = block_restorable;
  for (EntrySlot slot : lease.snapshots) restorable = std::max(restorable, table_.entry(slot).position);
  lease.capture_hint_tokens = observe_recurrence(c->ns, req, restorable, chain);
  uint64_t lease_id = 0;
  if (!lease.blocks.empty() || !lease.snapshots.empty() || !lease.inflight.empty() ||
      remote_probe) {
    lease_id = next_lease_id_++;
    ++leases_open_;
  }
  if (remote_probe) remote_start_probe(id, lease_id, *c, req, lease);
  describe_lease(*c, lease_id, lease, ret);
  uint32_t deepest = ret.restorable_tokens;
  ReuseKind deepest_kind = static_cast<ReuseKind>(ret.reuse_kind);
  for (const wire::SnapshotCandidate& s : ret.snapshots) {
    if (s.position > deepest) {
      deepest = s.position;
      deepest_kind = static_cast<ReuseKind>(s.reuse_kind);
    }
  }
  counters_.lookup_hit_tokens += deepest;
  table_.count_tokens(c->ns, deepest, 0);
  ++counters_.reuse[static_cast<size_t>(deepest_kind)];
  if (lease_id != 0) c->leases.emplace(lease_id, std::move(lease));
  return Status::Ok;
}

void Park::describe_lease(const Connection& c, uint64_t lease_id, const Lease& lease,
                          wire::LookupReply& ret) const {
  const NamespaceInfo& info = table_.namespace_info(c.ns);
  ret = wire::LookupReply{};
  ret.lease_id = lease_id;
  ret.capture_hint_tokens = lease.capture_hint_tokens;
  ret.inflight_tokens = lease_settled(lease) ? 0 : lease.inflight_tokens;
  // A dead entry (its disk copy failed verification) ends the usable chain.
  size_t blocks = 0;
  while (blocks < lease.blocks.size() && !table_.entry(lease.blocks[blocks]).dead) ++blocks;
  ret.restorable_tokens = info.geometry.snapshot_required
                              ? 0
                              : static_cast<uint32_t>(blocks * info.geometry.block_tokens);
  ret.reuse_kind = static_cast<uint8_t>(
      ret.restorable_tokens > 0
          ? reuse_kind_of(table_.entry(lease.blocks[blocks - 1]), lease.session_id)
          : ReuseKind::Root);
  for (size_t i = 0; i < blocks; ++i) {
    const Entry& e = table_.entry(lease.blocks[i]);
    ret.block_offsets.push_back(e.extent_offset);
    ret.block_checksums.push_back(e.payload_checksum);
    if (ret.host_blocks == i && table_.host_readable(e)) ++ret.host_blocks;
  }
  for (EntrySlot slot : lease.snapshots) {
    const Entry& e = table_.entry(slot);
    if (e.dead) continue;
    ret.snapshots.push_back({.extent_offset = e.extent_offset,
                             .position = e.position,
                             .anchor_chunks = e.anchor_chunks,
                             .reuse_kind = static_cast<uint32_t>(reuse_kind_of(e, lease.session_id)),
                             .ready = table_.host_readable(e) ? 1u : 0u,
                             .payload_checksum = e.payload_checksum});
  }
}

bool Park::lease_settled(const Lease& lease) const {
  auto settled = [&](EntrySlot slot) {
    const Entry& e = table_.entry(slot);
    return e.dead || !e.promoting;
  };
  auto written = [&](const std::pair<EntrySlot, uint64_t>& inflight) {
    const EntrySlot slot = table_.slot_for_id(inflight.second);
    return slot == no_slot || table_.entry(slot).sealed;  // sealed, or aborted and gone
  };
  return !lease.remote_pending && std::all_of(lease.blocks.begin(), lease.blocks.end(), settled) &&
         std::all_of(lease.snapshots.begin(), lease.snapshots.end(), settled) &&
         std::all_of(lease.inflight.begin(), lease.inflight.end(), written);
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
  if (req.timeout_msec > wait_timeout_msec_max) {
    ret_status = Status::InvalidArgument;
    return true;
  }
  const bool settled = lease_settled(it->second);
  if (settled || req.timeout_msec == 0) {
    describe_lease(*c, req.lease_id, it->second, ret);
    ret_status = settled ? Status::Ok : Status::Timeout;
    return true;
  }
  if (waiters_.size() >= waits_max) {
    ret_status = Status::LimitExceeded;
    return true;
  }
  uint64_t timeout_usec = uint64_t{req.timeout_msec} * 1000;
  // A follower never waits longer than prefilling the in-flight part itself would take.
  const uint32_t rate = table_.namespace_info(c->ns).prefill_tokens_per_second;
  if (rate > 0 && !it->second.inflight.empty()) {
    timeout_usec = std::min(timeout_usec, uint64_t{it->second.inflight_tokens} * 1'000'000 / rate);
  }
  waiters_.push_back({.connection = id,
                      .sequence = sequence,
                      .lease_id = req.lease_id,
                      .deadline_usec = monotonic_usec() + timeout_usec});
  return false;
}

void Park::answer_waiters(bool expire_only) {
  const uint64_t now = monotonic_usec();
  std::vector<Waiter> waiting;
  waiting.swap(waiters_);
  for (const Waiter& w : waiting) {
    auto conn = connections_.find(w.connection);
    if (conn == connections_.end()) continue;
    auto lease = conn->second.leases.find(w.lease_id);
    Status status = Status::Ok;
    wire::LookupReply reply;
    if (lease == conn->second.leases.end()) {
      status = Status::NotFound;  // released under its own WAIT: a client bug
    } else if (!expire_only && lease_settled(lease->second)) {
      describe_lease(conn->second, w.lease_id, lease->second, reply);
    } else if (now >= w.deadline_usec || lease_settled(lease->second)) {
      describe_lease(conn->second, w.lease_id, lease->second, reply);
      status = lease_settled(lease->second) ? Status::Ok : Status::Timeout;
    } else {
      waiters_.push_back(w);
      continue;
    }
    std::vector<uint8_t> frame;
    if (status == Status::Ok || status == Status::Timeout) {
      wire::encode(wire::Verb::Wait, reply, w.sequence, frame);
      const auto code = static_cast<uint16_t>(status);
      std::memcpy(frame.data() + 2, &code, sizeof code);
    } else {
      wire::encode(static_cast<uint16_t>(wire::Verb::Wait) | wire::reply_bit,
                   static_cast<uint16_t>(status), w.sequence, frame);
    }
    if (reply_sink_) reply_sink_(w.connection, std::move(frame));
  }
}

uint32_t Park::observe_recurrence(NamespaceIndex ns, const wire::LookupRequest& req,
                                  uint32_t restorable_tokens, uint32_t chain_tokens) {
  uint32_t hint = 0;
  const size_t first = restorable_tokens / chain_tokens;
  for (size_t j = first; j < req.chunk_hashes.size(); ++j) {
    const Hash128& h = req.chunk_hashes[j];
    auto [it, inserted] = recurrence_.try_emplace(h, RecurrenceSeen{.session_id = req.session_id});
    if (inserted) {
      // Bounded memory: forget the oldest chunk once the ring is full.
      if (recurrence_order_.size() < recurrence_chunks_max) {
        recurrence_order_.push_back(h);
      } else {
        recurrence_.erase(recurrence_order_[recurrence_next_]);
        recurrence_order_[recurrence_next_] = h;
        recurrence_next_ = (recurrence_next_ + 1) % recurrence_chunks_max;
      }
      continue;
    }
    if (it->second.session_id != req.session_id) it->second.recurring = true;
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
