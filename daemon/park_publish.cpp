// The publish verbs (RESERVE_BLOCKS, RESERVE_SNAPSHOT, SEAL, ABORT) and what they draw
// on: a reservation's entries are inserted reserved with their headers written, counted
// on the connection's and its uid's unsealed quotas, checked again at SEAL (headers,
// payload checksums), then written through to disk and behind to the remote tier as
// the policies say; one left unsealed too long is aborted (see park.h).
#include <algorithm>
#include <cassert>

#include "daemon/clock.h"
#include "daemon/entry_header.h"
#include "daemon/log.h"
#include "daemon/park.h"
#include "proto/limits.h"
#include "shm/arena_format.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {

shm::EntryHeader Park::make_entry_header(const Entry& e, uint32_t token_count,
                                         uint64_t payload_bytes) const {
  return daemon::make_entry_header(e, table_.namespace_info(e.ns), token_count, payload_bytes,
                                   options_.incarnation);
}

void Park::drop_reservation(Reservation& r) {
  for (EntrySlot slot : r.slots) table_.erase(slot);
  r.slots.clear();
  r.headers.clear();
}

Status Park::reserve_blocks(ConnectionId id, const wire::ReserveBlocksRequest& req,
                            wire::ReserveBlocksReply& ret) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  const NamespaceInfo& info = table_.namespace_info(c->ns);
  const uint32_t block_tokens = info.geometry.block_tokens;
  const size_t count = req.chunk_hashes.size();
  if (block_tokens == 0 || count == 0 ||
      (uint64_t{req.first_chunk} + count) * block_tokens > limits::lookup_tokens_max) {
    return Status::InvalidArgument;
  }
  if (c->reservations.size() >= limits::reservations_per_connection_max) {
    return Status::LimitExceeded;
  }
  ret = wire::ReserveBlocksReply{};
  ret.grants.resize(count);
  std::vector<size_t> wanted;
  std::vector<EntrySlot> present;
  for (size_t i = 0; i < count; ++i) {
    EntrySlot slot = table_.find_block(c->ns, req.chunk_hashes[i]);
    const bool repeated = std::find(req.chunk_hashes.begin(), req.chunk_hashes.begin() + i,
                                    req.chunk_hashes[i]) != req.chunk_hashes.begin() + i;
    if (slot != no_slot && table_.entry(slot).sealed) {
      ret.grants[i].disposition = static_cast<uint32_t>(wire::Disposition::Present);
      if (!repeated) present.push_back(slot);
    } else if (slot != no_slot || repeated) {
      ret.grants[i].disposition = static_cast<uint32_t>(wire::Disposition::InFlight);
    } else {
      wanted.push_back(i);
    }
  }
  if (wanted.size() * info.block_extent_bytes > options_.reservation_bytes_max ||
      !unsealed_quota_allows(*c, wanted.size() * info.block_extent_bytes)) {
    return Status::LimitExceeded;
  }
  // Present blocks are part of this chain: keep them from being evicted for it. A
  // block presented again as shared (or marked) is upgraded and written through now,
  // with whatever of its chain is not on disk yet.
  const auto request_class = static_cast<EntryClass>(req.options.entry_class);
  const auto request_evidence = static_cast<Evidence>(req.options.evidence);
  for (EntrySlot slot : present) {
    table_.touch(slot);
    if (table_.upgrade(slot, request_class, request_evidence) && write_through(table_.entry(slot))) {
      (void)spill_chain(slot, 0);
    }
    table_.acquire_lease(slot);
  }
  Reservation r;
  // A reservation that can never fit must not evict parked entries on its way to failing.
  Status status = wanted.size() * info.block_extent_bytes >
                          table_.bytes_free() + table_.evictable_bytes()
                      ? Status::ArenaFull
                      : Status::Ok;
  for (size_t i : wanted) {
    if (status != Status::Ok) break;
    NewEntry n{.ns = c->ns,
               .kind = EntryKind::Block,
               .key_hash = req.chunk_hashes[i],
               .parent_hash = i > 0             ? req.chunk_hashes[i - 1]
                              : req.first_chunk == 0 ? info.id
                                                     : req.parent_hash,
               .tail_tokens = {},
               .extent_bytes = info.block_extent_bytes,
               .position = static_cast<uint32_t>((req.first_chunk + i + 1) * block_tokens),
               .anchor_chunks = static_cast<uint32_t>(req.first_chunk + i),
               .creator_session = req.options.session_id,
               .entry_class = static_cast<EntryClass>(req.options.entry_class),
               .evidence = static_cast<Evidence>(req.options.evidence),
               .reserved_by = id};
    EntrySlot slot = no_slot;
    status = table_.insert_reserved(n, slot);
    if (status != Status::Ok) break;
    r.slots.push_back(slot);
    ret.grants[i].extent_offset = table_.entry(slot).extent_offset;
  }
  for (auto it = present.rbegin(); it != present.rend(); ++it) table_.release_lease(*it);
  if (status != Status::Ok) {
    drop_reservation(r);
    ret = wire::ReserveBlocksReply{};
    return status;
  }
  counters_.dedup_hits += present.size();  // only once the writer is told of them
  if (r.slots.empty()) return Status::Ok;
  for (EntrySlot slot : r.slots) {
    const Entry& e = table_.entry(slot);
    const shm::EntryHeader h =
        make_entry_header(e, block_tokens, info.geometry.block_payload_bytes);
    if (!write_entry_header(options_.arena_data, e, h)) {
      drop_reservation(r);
      ret = wire::ReserveBlocksReply{};
      return Status::IoError;
    }
    r.headers.push_back(h);
  }
  ret.reservation_id = keep_reservation(*c, std::move(r));
  return Status::Ok;
}

Status Park::reserve_snapshot(ConnectionId id, const wire::ReserveSnapshotRequest& req,
                              wire::ReserveSnapshotReply& ret) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  const NamespaceInfo& info = table_.namespace_info(c->ns);
  const uint64_t position = uint64_t{req.anchor_chunks} * info.chain_tokens + req.tail_tokens.size();
  if (req.tail_tokens.size() >= info.chain_tokens || position == 0 ||
      position > limits::lookup_tokens_max || req.payload_bytes == 0 ||
      req.payload_bytes > limits::snapshot_payload_bytes_max ||
      (req.anchor_chunks == 0 && req.anchor_hash != info.id)) {
    return Status::InvalidArgument;
  }
  if (c->reservations.size() >= limits::reservations_per_connection_max) {
    return Status::LimitExceeded;
  }
  ret = wire::ReserveSnapshotReply{};
  if (EntrySlot slot = table_.find_snapshot(c->ns, req.anchor_hash, req.tail_tokens);
      slot != no_slot) {
    const bool sealed = table_.entry(slot).sealed;
    if (sealed) {
      table_.touch(slot);
      ++counters_.dedup_hits;
      if (table_.upgrade(slot, static_cast<EntryClass>(req.options.entry_class),
                         static_cast<Evidence>(req.options.evidence)) &&
          write_through(table_.entry(slot))) {
        (void)spill_chain(slot, 0);
      }
    }
    ret.disposition = static_cast<uint32_t>(sealed ? wire::Disposition::Present
                                                   : wire::Disposition::InFlight);
    return Status::Ok;
  }
  const uint32_t tail = static_cast<uint32_t>(req.tail_tokens.size());
  const uint64_t extent_bytes = shm::extent_bytes_for(tail, req.payload_bytes);
  if (extent_bytes > options_.reservation_bytes_max || !unsealed_quota_allows(*c, extent_bytes))
    return Status::LimitExceeded;
  NewEntry n{.ns = c->ns,
             .kind = EntryKind::Snapshot,
             .key_hash = req.anchor_hash,
             .tail_tokens = req.tail_tokens,
             .extent_bytes = extent_bytes,
             .position = static_cast<uint32_t>(position),
             .anchor_chunks = req.anchor_chunks,
             .creator_session = req.options.session_id,
             .entry_class = static_cast<EntryClass>(req.options.entry_class),
             .evidence = static_cast<Evidence>(req.options.evidence),
             .reserved_by = id};
  EntrySlot slot = no_slot;
  if (Status s = table_.insert_reserved(n, slot); s != Status::Ok) return s;
  const Entry& e = table_.entry(slot);
  // The daemon knows a snapshot's tail, so it writes header and tokens itself.
  shm::EntryHeader h = make_entry_header(e, tail, req.payload_bytes);
  uint8_t* extent = options_.arena_data + e.extent_offset;
  // An empty tail may have no storage: memcpy from null is undefined.
  const bool written = shm::guarded_copy(extent, &h, sizeof h) &&
                       (tail == 0 || shm::guarded_copy(extent + limits::entry_header_bytes,
                                                       req.tail_tokens.data(), tail * sizeof(int32_t)));
  Reservation r;
  r.slots.push_back(slot);
  if (!written) {
    log_arena_fault(e.extent_offset);
    drop_reservation(r);
    return Status::IoError;
  }
  r.headers.push_back(h);
  ret.extent_offset = e.extent_offset;
  ret.extent_bytes = e.extent_bytes;
  ret.payload_offset = h.payload_offset;
  ret.disposition = static_cast<uint32_t>(wire::Disposition::Reserved);
  ret.reservation_id = keep_reservation(*c, std::move(r));
  return Status::Ok;
}

Status Park::seal(ConnectionId id, const wire::ReservationRequest& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  auto it = c->reservations.find(req.reservation_id);
  if (it == c->reservations.end()) return Status::NotFound;
  Reservation& r = it->second;
  if (req.payload_checksums.size() != r.slots.size()) return Status::InvalidArgument;
  // Pair assertion with reserve: a client may write payload and tokens, never headers.
  bool intact = true;
  for (size_t i = 0; i < r.slots.size(); ++i) {
    const uint8_t* extent = options_.arena_data + table_.entry(r.slots[i]).extent_offset;
    intact = intact && shm::guarded_equal(extent, &r.headers[i], sizeof(shm::EntryHeader));
  }
  Status status = Status::Ok;
  if (intact) {
    // Deepest first, so a chain's root ends up the most recently used.
    const uint64_t now = coarse_monotonic_usec();
    for (size_t i = r.slots.size(); i-- > 0;) table_.seal(r.slots[i], req.payload_checksums[i], now);
    // Shared heads and explicit breakpoints are written through to disk, chain order
    // (a block's predecessors first; see spill_chain).
    for (EntrySlot slot : r.slots) {
      if (write_through(table_.entry(slot))) (void)spill_chain(slot, 0);
    }
    for (EntrySlot slot : r.slots) remote_.write_behind(slot);
    keep_low_water();  // demote now rather than at the next tick: bursts outrun ticks
  } else {
    ++counters_.seal_corrupt;
    drop_reservation(r);
    status = Status::Corrupt;
  }
  forget_reservation(*c, it);
  answer_waiters(false);  // followers waiting for these entries
  return status;
}

Status Park::abort(ConnectionId id, const wire::ReservationRequest& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  auto it = c->reservations.find(req.reservation_id);
  if (it == c->reservations.end()) return Status::NotFound;
  drop_reservation(it->second);
  forget_reservation(*c, it);
  answer_waiters(false);
  return Status::Ok;
}

bool Park::unsealed_quota_allows(const Connection& c, uint64_t bytes) {
  const auto held = unsealed_by_uid_.find(c.peer_uid);
  const uint64_t uid_bytes = held == unsealed_by_uid_.end() ? 0 : held->second;
  const uint64_t connection_max = options_.unsealed_connection_bytes_max;
  const uint64_t uid_max = options_.unsealed_uid_bytes_max;
  // What one holds beyond a reservation of its own: a single reservation is bounded by
  // reservation_max alone (an engine publishing one large head is no hog).
  const bool connection_over =
      connection_max != 0 && c.unsealed_bytes > 0 && c.unsealed_bytes + bytes > connection_max;
  const bool uid_over = uid_max != 0 && uid_bytes > 0 && uid_bytes + bytes > uid_max;
  if (!connection_over && !uid_over) return true;
  ++counters_.unsealed_quota_refusals;
  log_warning_limited(
      "kvparkd: pid %u: reservation of %llu bytes refused (LIMIT_EXCEEDED): its %s would hold "
      "%llu bytes reserved and unsealed, past unsealed_per_%s (%llu)",
      c.peer_pid, static_cast<unsigned long long>(bytes),
      connection_over ? "connection" : "uid",
      static_cast<unsigned long long>((connection_over ? c.unsealed_bytes : uid_bytes) + bytes),
      connection_over ? "connection" : "uid",
      static_cast<unsigned long long>(connection_over ? connection_max : uid_max));
  return false;
}

uint64_t Park::keep_reservation(Connection& c, Reservation&& r) {
  r.bytes = 0;
  for (EntrySlot slot : r.slots) r.bytes += table_.entry(slot).extent_bytes;
  r.created_usec = monotonic_usec();
  c.unsealed_bytes += r.bytes;
  unsealed_by_uid_[c.peer_uid] += r.bytes;
  const uint64_t id = next_reservation_id_++;
  c.reservations.emplace(id, std::move(r));
  ++reservations_open_;
  return id;
}

void Park::forget_reservation(Connection& c, std::map<uint64_t, Reservation>::iterator it) {
  const uint64_t bytes = it->second.bytes;
  c.unsealed_bytes -= bytes;
  auto held = unsealed_by_uid_.find(c.peer_uid);
  assert(held != unsealed_by_uid_.end() && held->second >= bytes);
  if ((held->second -= bytes) == 0) unsealed_by_uid_.erase(held);
  c.reservations.erase(it);
  --reservations_open_;
}

void Park::expire_reservations(uint64_t now_usec) {
  bool expired = false;
  for (auto& [id, c] : connections_) {
    for (auto it = c.reservations.begin(); it != c.reservations.end();) {
      auto next = std::next(it);
      if (now_usec - it->second.created_usec >= limits::unsealed_deadline_usec) {
        log_warning_limited("kvparkd: pid %u left a reservation of %llu bytes unsealed for %llu s: "
                            "aborted, its space given back",
                            c.peer_pid, static_cast<unsigned long long>(it->second.bytes),
                            static_cast<unsigned long long>(limits::unsealed_deadline_usec /
                                                            1'000'000));
        drop_reservation(it->second);
        forget_reservation(c, it);
        ++counters_.reservations_expired;
        expired = true;
      }
      it = next;
    }
  }
  if (expired) answer_waiters(false);  // followers of what was never sealed go alone
}

}  // namespace kvpark::daemon
