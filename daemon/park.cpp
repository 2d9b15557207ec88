// Verb handlers and leases of the daemon core (see park.h): connections, HELLO,
// RELEASE, the operator's commands, the tick and STATS. LOOKUP and WAIT are in
// park_lookup.cpp, the publish verbs in park_publish.cpp, the tiers' traffic in
// disk_mover.cpp and remote_mover.cpp.
#include "daemon/park.h"

#include <signal.h>

#include <algorithm>
#include <cassert>
#include <cerrno>

#include "daemon/clock.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_header.h"
#include "daemon/eviction_policy.h"
#include "daemon/log.h"
#include "proto/limits.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

Park::Park(const ParkOptions& options, EntryTable& table)
    : options_(options),
      table_(table),
      disk_({.arena_data = options.arena_data,
             .incarnation = options.incarnation,
             .disk = options.disk},
            table, counters_),
      remote_({.arena_data = options.arena_data,
               .incarnation = options.incarnation,
               .remote = options.remote,
               .reservation_bytes_max = &options_.reservation_bytes_max},
              table, disk_, counters_,
              {.find_lease = [this](ConnectionId id, uint64_t lease_id) { return find_lease(id, lease_id); },
               .connection_namespace =
                   [this](ConnectionId id, NamespaceIndex* ret_ns) {
                     const auto c = connections_.find(id);
                     if (c == connections_.end()) return false;
                     *ret_ns = c->second.ns;
                     return true;
                   }}) {
  assert(options.arena_data != nullptr && options.reservation_bytes_max > 0);
  table_.set_host_victim_policy(&least_valuable_of_coldest);
  table_.set_host_eviction_cost(&host_eviction_value);
}

Status Park::open(ConnectionId id, uint32_t peer_pid, uint32_t peer_uid) {
  if (connections_.size() >= options_.connections_max) return Status::LimitExceeded;
  auto [it, inserted] = connections_.try_emplace(id);
  assert(inserted && "connection ids are never reused while open");
  it->second.peer_pid = peer_pid;
  it->second.peer_uid = peer_uid;
  if (options_.state != nullptr) it->second.state_slot = options_.state->add_connection(peer_pid);
  return Status::Ok;
}

void Park::hold_adopted(const std::vector<uint32_t>& pids, uint64_t deadline_usec) {
  previous_pids_.clear();
  for (uint32_t pid : pids) ++previous_pids_[pid];
  hold_deadline_usec_ = deadline_usec;
  holding_ = true;
  if (previous_pids_.empty()) end_adoption_hold("no engine was connected to the previous instance");
}

void Park::end_adoption_hold(const char* why) {
  if (!holding_) return;
  holding_ = false;
  previous_pids_.clear();
  const uint64_t held = table_.held_bytes();
  table_.release_adoption_hold();
  if (options_.state != nullptr) options_.state->release_previous_connections();
  log_info("kvparkd: adopted entries (%llu MiB) may be evicted from now on: %s",
           static_cast<unsigned long long>(held >> 20), why);
}

void Park::close(ConnectionId id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  Connection& c = it->second;
  for (auto& [reservation_id, r] : c.reservations) drop_reservation(r);
  for (auto& [lease_id, lease] : c.leases) drop_lease(lease);
  while (!c.reservations.empty()) forget_reservation(c, c.reservations.begin());
  leases_open_ -= c.leases.size();
  single_flight_.forget(id);
  if (options_.state != nullptr) options_.state->remove_connection(c.state_slot);
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
  if (req.protocol_version < limits::protocol_version_min ||
      req.protocol_version > limits::protocol_version) {
    return Status::InvalidArgument;
  }
  // A block no reservation can ever hold (bigger than the largest reservation, itself
  // at most the arena) is refused here, not at every RESERVE.
  if (req.geometry.block_tokens != 0 && req.geometry.block_tokens <= limits::block_tokens_max &&
      req.geometry.block_payload_bytes <= limits::block_payload_bytes_max &&
      shm::extent_bytes_for(req.geometry.block_tokens, req.geometry.block_payload_bytes) >
          std::min(options_.reservation_bytes_max, table_.data_bytes())) {
    return Status::LimitExceeded;
  }
  // When every namespace index is taken, one that holds nothing may be reused: not one
  // a connection or a remote snapshot probe still names (leases, reservations and block
  // probes belong to connections; entries are counted by the table).
  const auto in_use = [this](NamespaceIndex ns) {
    for (const auto& [other, connection] : connections_)
      if (connection.greeted && connection.ns == ns) return true;
    return remote_.names_namespace(ns);
  };
  NamespaceIndex ns = 0;
  if (Status s = table_.register_namespace(req.namespace_id, req.geometry,
                                           req.prefill_tokens_per_second, ns, in_use);
      s != Status::Ok) {
    return s;
  }
  c.greeted = true;
  c.ns = ns;
  // An engine of the previous instance is back: its old leases are gone with its
  // reconnection (libkvpark releases nothing across generations), unless it says it
  // still holds plans or reservations made before (another thread may be copying out
  // of a lease or into a reserved extent). Then that process is waited for until it
  // exits or the grace passes, whatever its other connections say: the daemon cannot
  // tell which of them holds the grant.
  if (auto back = previous_pids_.find(c.peer_pid); holding_ && back != previous_pids_.end()) {
    if (req.holds_earlier_grants) {
      if (back->second != previous_engine_until_exit) {
        log_info(
            "kvparkd: engine pid %u came back still holding plans or reservations of the "
            "previous instance; adopted extents stay held until it exits or the grace passes",
            c.peer_pid);
      }
      back->second = previous_engine_until_exit;
    } else if (back->second != previous_engine_until_exit && --back->second == 0) {
      previous_pids_.erase(back);
      if (previous_pids_.empty())
        end_adoption_hold("every engine of the previous instance came back");
    }
  }
  const NamespaceInfo& info = table_.namespace_info(ns);
  ret.data_bytes = options_.arena_data_bytes;
  ret.incarnation = options_.incarnation;
  ret.connection_id = id;
  ret.chain_tokens = info.chain_tokens;
  ret.block_extent_bytes = info.block_extent_bytes;
  ret.block_payload_offset =
      info.geometry.block_tokens == 0 ? 0 : shm::payload_offset_for(info.geometry.block_tokens);
  return Status::Ok;
}

void Park::drop_lease(Lease& lease) {
  count_lookup(lease, true);
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
  // What the client says it restored, at most what the lease's entries cover.
  uint32_t covered = 0;
  auto cover = [&](EntrySlot slot) {
    const Entry& e = table_.entry(slot);
    if (!e.dead) covered = std::max(covered, e.position);  // dead: reported corrupt
  };
  for (EntrySlot slot : it->second.blocks) cover(slot);
  for (EntrySlot slot : it->second.snapshots) cover(slot);
  const uint32_t restored = std::min(req.restored_tokens, covered);
  counters_.restored_tokens += restored;
  table_.count_tokens(c->ns, 0, restored);
  drop_lease(it->second);
  c->leases.erase(it);
  --leases_open_;
  return Status::Ok;
}

void Park::report_corrupt(ConnectionId id, const wire::CorruptReport& req) {
  Connection* c = greeted(id);
  if (c == nullptr) return;
  auto it = c->leases.find(req.lease_id);
  if (it == c->leases.end()) return;
  const Lease& lease = it->second;
  auto named = [&](EntrySlot slot) {
    const Entry& e = table_.entry(slot);
    return !e.dead && e.on_host && !e.promoting && e.extent_offset == req.extent_offset;
  };
  EntrySlot slot = no_slot;
  for (EntrySlot s : lease.blocks) slot = slot == no_slot && named(s) ? s : slot;
  for (EntrySlot s : lease.snapshots) slot = slot == no_slot && named(s) ? s : slot;
  if (slot == no_slot || c->refuted_report) return;
  const Entry& e = table_.entry(slot);
  // Checked before anything is dropped: a careless or hostile engine must not be able
  // to take entries (and their disk records) from everyone else by saying so.
  if (payload_intact(options_.arena_data, e, table_.namespace_info(e.ns))) {
    ++counters_.corrupt_reports_refuted;
    c->refuted_report = true;
    log_warning_limited(
        "kvparkd: an engine (pid %u) reported the payload of entry %llx altered, "
        "but it matches its checksum: kept, and that connection's reports are "
        "ignored from now on",
        c->peer_pid, static_cast<unsigned long long>(table_.entry_id(slot)));
    return;
  }
  ++counters_.corrupt_payloads;
  log_warning_limited("kvparkd: an engine (pid %u) found the payload of entry %llx altered; dropped",
                      c->peer_pid, static_cast<unsigned long long>(table_.entry_id(slot)));
  // A spill reading it right now keeps the slot until it completes; the engine has
  // already treated it as a miss, and the next reader finds it failing again.
  if (e.io_pins > 0) return;
  if (e.on_disk && options_.disk != nullptr) options_.disk->remove(e, table_.namespace_info(e.ns));
  table_.kill(slot);
}

Status Park::evict_entry(EntrySlot slot) {
  const Entry& e = table_.entry(slot);
  if (!e.sealed || e.leases > 0 || e.pinned || e.io_pins > 0) return Status::BadState;
  if (e.on_disk) remove_from_disk(slot);
  const Entry& left = table_.entry(slot);
  if (!left.in_use || left.dead) return Status::Ok;
  // An adopted entry leaves the index now and its extent when the hold ends: the
  // previous instance's engines may still be copying out of it.
  if (left.adoption_hold) {
    table_.kill(slot);
  } else {
    table_.erase(slot);
  }
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

void Park::tick() { tick_at(monotonic_usec()); }

void Park::tick_at(uint64_t now_usec) {
  if (holding_) {
    // An engine that exited holds no lease.
    std::erase_if(previous_pids_, [](const auto& p) {
      return kill(static_cast<pid_t>(p.first), 0) != 0 && errno == ESRCH;
    });
    if (previous_pids_.empty()) {
      end_adoption_hold("every engine of the previous instance came back or exited");
    } else if (now_usec >= hold_deadline_usec_) {
      end_adoption_hold("the grace for leases of the previous instance passed");
    }
  }
  remote_.expire_probes();
  expire_reservations(now_usec);
  answer_waiters(true);
  keep_low_water();
  disk_.enforce_disk_capacity();
  advance_flush();
}

Lease* Park::find_lease(ConnectionId id, uint64_t lease_id) {
  auto c = connections_.find(id);
  if (c == connections_.end()) return nullptr;
  auto lease = c->second.leases.find(lease_id);
  return lease != c->second.leases.end() ? &lease->second : nullptr;
}

void Park::on_remote_completions() {
  remote_.take_completions();
  answer_waiters(false);
}

void Park::on_disk_completions() {
  if (disk_.take_completions()) answer_waiters(false);  // promotions finished
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
  s.corrupt_payloads = counters_.corrupt_payloads;
  s.arena_pages = options_.arena_pages;
  s.arena_page_bytes = options_.arena_page_bytes;
  return s;
}

}  // namespace kvpark::daemon
