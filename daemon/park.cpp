// Verb handlers of the daemon core (see park.h). Disk policy lives in park_disk.cpp.
#include "daemon/park.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <ctime>

#include "daemon/disk_tier.h"
#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {
namespace {

uint64_t monotonic_usec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000 + uint64_t(ts.tv_nsec) / 1000;
}

}  // namespace

Park::Park(const ParkOptions& options, EntryTable& table) : options_(options), table_(table) {
  assert(options.arena_data != nullptr && options.reservation_bytes_max > 0);
  table_.set_value_function([this](const Entry& e) { return value_density(e); });
}

Status Park::open(ConnectionId id, uint32_t peer_pid) {
  if (connections_.size() >= options_.connections_max) return Status::LimitExceeded;
  auto [it, inserted] = connections_.try_emplace(id);
  assert(inserted && "connection ids are never reused while open");
  it->second.peer_pid = peer_pid;
  return Status::Ok;
}

void Park::close(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  for (auto& [reservation_id, r] : c.reservations) drop_reservation(r);
  for (auto& [lease_id, lease] : c.leases) drop_lease(lease);
  reservations_open_ -= c.reservations.size();
  leases_open_ -= c.leases.size();
  std::erase_if(waiters_, [id](const Waiter& w) { return w.connection == id; });
  connections_.erase(it);
  answer_waiters(false);  // its reservations are gone: followers go ahead alone
}

Park::Connection* Park::greeted(ConnectionId id) {
  auto it = connections_.find(id);
  assert(it != connections_.end());
  return it->second.greeted ? &it->second : nullptr;
}

Status Park::hello(ConnectionId id, const wire::HelloRequest& req, wire::HelloReply& ret) {
  Connection& c = connections_.at(id);
  if (c.greeted) return Status::BadState;  // one namespace per connection
  if (req.protocol_version != limits::protocol_version) return Status::InvalidArgument;
  NamespaceIndex ns = 0;
  if (Status s = table_.register_namespace(req.namespace_id, req.geometry,
                                           req.prefill_tokens_per_second, ns);
      s != Status::Ok) {
    return s;
  }
  c.greeted = true;
  c.ns = ns;
  const NamespaceInfo& info = table_.namespace_info(ns);
  ret.arena_bytes = options_.arena_bytes;
  ret.incarnation = options_.incarnation;
  ret.connection_id = id;
  ret.chain_tokens = info.chain_tokens;
  ret.block_extent_bytes = info.block_extent_bytes;
  ret.block_payload_offset =
      info.geometry.block_tokens == 0 ? 0 : shm::payload_offset_for(info.geometry.block_tokens);
  return Status::Ok;
}

ReuseKind Park::reuse_kind_of(const Entry& e, uint64_t session_id) const {
  return e.entry_class == EntryClass::Shared || e.creator_session != session_id
             ? ReuseKind::SharedStablePrefix
             : ReuseKind::PrivateTurnClosure;
}

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
  // Longest run of sealed blocks, leaving at least one token to prefill.
  if (block_tokens > 0) {
    const size_t blocks_max = (req.prompt_tokens - 1) / block_tokens;
    for (size_t i = 0; i < std::min(chunks, blocks_max); ++i) {
      const EntrySlot slot = table_.find_block(c->ns, req.chunk_hashes[i]);
      if (!usable(slot)) break;
      table_.acquire_lease(slot);
      lease.blocks.push_back(slot);
    }
  }
  const bool snapshot_required = info.geometry.snapshot_required;
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
  for (size_t j = anchor_max + 1; j-- > 0;) {
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
    while (lease.blocks.size() > needed) {
      table_.release_lease(lease.blocks.back());
      lease.blocks.pop_back();
    }
  }

  ++counters_.lookups;
  for (auto it = lease.snapshots.rbegin(); it != lease.snapshots.rend(); ++it) table_.touch(*it);
  for (auto it = lease.blocks.rbegin(); it != lease.blocks.rend(); ++it) table_.touch(*it);
  lease.capture_hint_tokens = observe_recurrence(c->ns, req, block_restorable, chain);
  uint64_t lease_id = 0;
  if (!lease.blocks.empty() || !lease.snapshots.empty() || !lease.inflight.empty()) {
    lease_id = next_lease_id_++;
    ++leases_open_;
  }
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
    if (ret.host_blocks == i && table_.host_readable(e)) ++ret.host_blocks;
  }
  for (EntrySlot slot : lease.snapshots) {
    const Entry& e = table_.entry(slot);
    if (e.dead) continue;
    ret.snapshots.push_back({.extent_offset = e.extent_offset,
                             .position = e.position,
                             .anchor_chunks = e.anchor_chunks,
                             .reuse_kind = static_cast<uint32_t>(reuse_kind_of(e, lease.session_id)),
                             .ready = table_.host_readable(e) ? 1u : 0u});
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
  return std::all_of(lease.blocks.begin(), lease.blocks.end(), settled) &&
         std::all_of(lease.snapshots.begin(), lease.snapshots.end(), settled) &&
         std::all_of(lease.inflight.begin(), lease.inflight.end(), written);
}

void Park::drop_lease(Lease& lease) {
  for (auto it = lease.snapshots.rbegin(); it != lease.snapshots.rend(); ++it) {
    table_.release_lease(*it);
  }
  // Deepest first, so the root of a chain ends up the most recently used.
  for (auto it = lease.blocks.rbegin(); it != lease.blocks.rend(); ++it) {
    table_.release_lease(*it);
  }
  lease.blocks.clear();
  lease.snapshots.clear();
}

Status Park::release(ConnectionId id, const wire::ReleaseRequest& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  auto it = c->leases.find(req.lease_id);
  if (it == c->leases.end()) return Status::NotFound;
  drop_lease(it->second);
  c->leases.erase(it);
  --leases_open_;
  return Status::Ok;
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

shm::EntryHeader Park::make_entry_header(const Entry& e, uint32_t token_count,
                                         uint64_t payload_bytes) const {
  shm::EntryHeader h{};
  h.magic = shm::entry_magic;
  h.format_version = shm::entry_format_version;
  h.kind = static_cast<uint8_t>(e.kind);
  h.namespace_id = table_.namespace_info(e.ns).id;
  h.key_hash = e.key_hash;
  h.payload_bytes = payload_bytes;
  h.payload_offset = shm::payload_offset_for(token_count);
  h.token_count = token_count;
  h.position = e.position;
  h.anchor_chunks = e.anchor_chunks;
  h.incarnation = options_.incarnation;
  return h;
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
  if (wanted.size() * info.block_extent_bytes > options_.reservation_bytes_max) {
    return Status::LimitExceeded;
  }
  counters_.dedup_hits += present.size();
  // Present blocks are part of this chain: keep them from being evicted for it.
  for (EntrySlot slot : present) {
    table_.touch(slot);
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
  if (r.slots.empty()) return Status::Ok;
  for (EntrySlot slot : r.slots) {
    const Entry& e = table_.entry(slot);
    shm::EntryHeader h = make_entry_header(e, block_tokens, info.geometry.block_payload_bytes);
    std::memcpy(options_.arena_data + e.extent_offset, &h, sizeof h);
    r.headers.push_back(h);
  }
  ret.reservation_id = next_reservation_id_++;
  c->reservations.emplace(ret.reservation_id, std::move(r));
  ++reservations_open_;
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
    }
    ret.disposition = static_cast<uint32_t>(sealed ? wire::Disposition::Present
                                                   : wire::Disposition::InFlight);
    return Status::Ok;
  }
  const uint32_t tail = static_cast<uint32_t>(req.tail_tokens.size());
  const uint64_t extent_bytes = shm::extent_bytes_for(tail, req.payload_bytes);
  if (extent_bytes > options_.reservation_bytes_max) return Status::LimitExceeded;
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
  std::memcpy(extent, &h, sizeof h);
  std::memcpy(extent + limits::entry_header_bytes, req.tail_tokens.data(),
              tail * sizeof(int32_t));
  Reservation r;
  r.slots.push_back(slot);
  r.headers.push_back(h);
  ret.reservation_id = next_reservation_id_++;
  ret.extent_offset = e.extent_offset;
  ret.extent_bytes = e.extent_bytes;
  ret.payload_offset = h.payload_offset;
  ret.disposition = static_cast<uint32_t>(wire::Disposition::Reserved);
  c->reservations.emplace(ret.reservation_id, std::move(r));
  ++reservations_open_;
  return Status::Ok;
}

Status Park::seal(ConnectionId id, const wire::ReservationRequest& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  auto it = c->reservations.find(req.reservation_id);
  if (it == c->reservations.end()) return Status::NotFound;
  Reservation& r = it->second;
  // Pair assertion with reserve: a client may write payload and tokens, never headers.
  bool intact = true;
  for (size_t i = 0; i < r.slots.size(); ++i) {
    const uint8_t* extent = options_.arena_data + table_.entry(r.slots[i]).extent_offset;
    intact = intact && std::memcmp(extent, &r.headers[i], sizeof(shm::EntryHeader)) == 0;
  }
  Status status = Status::Ok;
  if (intact) {
    // Deepest first, so a chain's root ends up the most recently used.
    for (auto s = r.slots.rbegin(); s != r.slots.rend(); ++s) table_.seal(*s);
    // Shared heads and explicit breakpoints are written through to disk.
    for (EntrySlot slot : r.slots) {
      const Entry& e = table_.entry(slot);
      if (e.entry_class == EntryClass::Shared || e.evidence == Evidence::ExplicitBreakpoint) {
        (void)start_spill(slot, 0);
      }
    }
  } else {
    ++counters_.seal_corrupt;
    drop_reservation(r);
    status = Status::Corrupt;
  }
  c->reservations.erase(it);
  --reservations_open_;
  answer_waiters(false);  // followers waiting for these entries
  return status;
}

Status Park::abort(ConnectionId id, const wire::ReservationRequest& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return Status::BadState;
  auto it = c->reservations.find(req.reservation_id);
  if (it == c->reservations.end()) return Status::NotFound;
  drop_reservation(it->second);
  c->reservations.erase(it);
  --reservations_open_;
  answer_waiters(false);
  return Status::Ok;
}

Status Park::evict_entry(EntrySlot slot) {
  const Entry& e = table_.entry(slot);
  if (!e.sealed || e.leases > 0 || e.pinned || e.io_pins > 0) return Status::BadState;
  if (e.on_disk) remove_from_disk(slot);
  if (table_.entry(slot).in_use) table_.erase(slot);
  return Status::Ok;
}

Status Park::drop_namespace(const NamespaceId& id, uint64_t& ret_dropped) {
  uint64_t dropped = 0;
  bool found = false;
  for (size_t ns = 0; ns < table_.namespace_count() && !found; ++ns) {
    found = table_.namespace_info(static_cast<NamespaceIndex>(ns)).id == id;
  }
  for (EntrySlot slot = 0; slot < table_.slot_count(); ++slot) {
    const Entry& e = table_.entry(slot);
    if (!e.in_use || e.dead || table_.namespace_info(e.ns).id != id) continue;
    if (e.sealed && e.leases == 0 && e.io_pins == 0 && evict_entry_unpinned(slot)) ++dropped;
  }
  ret_dropped = dropped;
  return found ? Status::Ok : Status::NotFound;
}

bool Park::evict_entry_unpinned(EntrySlot slot) {
  if (table_.entry(slot).pinned) table_.set_pinned(slot, false);
  return evict_entry(slot) == Status::Ok;
}

uint32_t Park::observe_recurrence(NamespaceIndex ns, const wire::LookupRequest& req,
                                  uint32_t restorable_tokens, uint32_t chain_tokens) {
  (void)ns;  // chunk hashes are seeded by the namespace: no two namespaces share one
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
    if (it->second.recurring && position >= restorable_tokens + recurrence_tokens_min) {
      hint = position;  // the deepest chunk two sessions share
    }
  }
  return hint;
}

void Park::tick() {
  answer_waiters(true);
  keep_low_water();
  advance_flush();
}

wire::StatsReply Park::stats() const {
  wire::StatsReply s;
  s.arena_data_bytes = table_.data_bytes();
  s.arena_free_bytes = table_.bytes_free();
  s.arena_largest_free_bytes = table_.largest_free_bytes();
  s.blocks = table_.blocks();
  s.snapshots = table_.snapshots();
  s.namespaces = table_.namespace_count();
  s.connections = connections_.size();
  s.leases = leases_open_;
  s.reservations = reservations_open_;
  s.lookups = counters_.lookups;
  s.lookup_hit_tokens = counters_.lookup_hit_tokens;
  s.evictions = table_.evictions();
  s.dedup_hits = counters_.dedup_hits;
  s.protocol_errors = counters_.protocol_errors;
  s.disk_entries = table_.disk_entries();
  s.disk_bytes = table_.disk_bytes();
  s.spills = counters_.spills;
  s.spill_failures = counters_.spill_failures;
  s.promotions = counters_.promotions;
  s.checksum_failures = counters_.checksum_failures;
  return s;
}

}  // namespace kvpark::daemon
