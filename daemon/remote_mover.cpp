// The remote tier's traffic (remote_mover.h): write-behind of sealed entries, the
// existence check of a lookup's missing chain, and promotion of what the store has
// into the arena (remote -> host, then to disk by the disk policy). See
// docs/remote.md. The lookup side of snapshots is remote_mover_snapshots.cpp.
//
// A promotion reserves each found block in the arena for the remote pseudo-connection
// (remote_connection_id): lookups of other engines see it in flight (single flight),
// the lease that asked lists it as in flight, and it is sealed only once its bytes
// passed every check: each chunk's and the payload's checksum (the worker), then its
// chain hash over its token ids, which proves the tokens are the ones the key names.
// A failure erases the reservation: a miss, never a wrong byte served.
#include <cassert>
#include <utility>

#include "daemon/clock.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_header.h"
#include "daemon/log.h"
#include "daemon/remote_mover.h"
#include "daemon/remote_tier.h"
#include "daemon/value_model.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {
namespace {

remote::EntryKey block_key(const NamespaceInfo& ns, const Hash128& hash) {
  return remote::EntryKey{.ns = ns.id, .key_hash = hash};
}

}  // namespace

RemoteMover::RemoteMover(const RemoteMoverOptions& options, EntryTable& table, DiskMover& disk,
                         Counters& counters, RemoteLeases leases)
    : arena_data_(options.arena_data),
      incarnation_(options.incarnation),
      remote_(options.remote),
      reservation_bytes_max_(*options.reservation_bytes_max),
      table_(table),
      disk_(disk),
      counters_(counters),
      leases_(std::move(leases)) {}

bool RemoteMover::reserve_for_fetch(const NewEntry& n, uint32_t token_count, uint64_t payload_bytes,
                                    EntrySlot* ret_slot, remote::ImageTarget* ret_target) {
  EntrySlot slot = no_slot;
  if (table_.insert_reserved(n, slot) != Status::Ok) return false;
  const Entry& e = table_.entry(slot);
  const shm::EntryHeader header = header_for(e, token_count, payload_bytes);
  if (!write_entry_header(arena_data_, e, header)) {
    table_.erase(slot);
    return false;
  }
  uint8_t* extent = arena_data_ + e.extent_offset;
  *ret_target = remote::ImageTarget{.tokens = extent + limits::entry_header_bytes,
                                    .tokens_bytes = uint64_t{token_count} * sizeof(int32_t),
                                    .payload = extent + header.payload_offset,
                                    .payload_bytes = payload_bytes,
                                    .copy = shm::guarded_copy};
  table_.pin_io(slot);  // the worker writes the extent until the read completes
  *ret_slot = slot;
  return true;
}

bool RemoteMover::names_namespace(NamespaceIndex ns) const {
  for (const auto& [lease, p] : snapshot_probes_)
    if (p.ns == ns) return true;
  return false;
}

shm::EntryHeader RemoteMover::header_for(const Entry& e, uint32_t token_count,
                                         uint64_t payload_bytes) const {
  return make_entry_header(e, table_.namespace_info(e.ns), token_count, payload_bytes,
                           incarnation_);
}

void RemoteMover::write_behind(EntrySlot slot) {
  RemoteTier* tier = remote_;
  if (tier == nullptr || tier->write_policy() == RemoteWritePolicy::Off) return;
  const Entry& e = table_.entry(slot);
  if (!table_.host_readable(e) || e.dead) return;
  const NamespaceInfo& ns = table_.namespace_info(e.ns);
  const bool shared = e.entry_class == EntryClass::Shared || e.evidence == Evidence::ObservedRecurrence;
  if (tier->write_policy() == RemoteWritePolicy::Shared && !shared) return;
  if (!tier->probing_useful()) return;  // down: skipped, not queued
  const bool snapshot = e.kind == EntryKind::Snapshot;
  const uint8_t* extent = arena_data_ + e.extent_offset;
  remote::EntryKey key = block_key(ns, e.key_hash);
  uint32_t token_count = ns.geometry.block_tokens;
  uint64_t payload_bytes = ns.geometry.block_payload_bytes;
  if (snapshot) {
    key = remote::EntryKey{.ns = ns.id,
                           .key_hash = e.key_hash,
                           .snapshot = true,
                           .position = e.position,
                           .tail_digest = remote::tail_digest_of(e.tail_tokens)};
    token_count = static_cast<uint32_t>(e.tail_tokens.size());
    // Pair check with the header this daemon wrote at reserve before trusting its size.
    shm::EntryHeader header{};
    if (!shm::guarded_copy(&header, extent, sizeof header) || header.magic != shm::entry_magic ||
        header.key_hash != e.key_hash || header.token_count != token_count ||
        header.payload_offset != shm::payload_offset_for(token_count) ||
        shm::extent_bytes_for(token_count, header.payload_bytes) != e.extent_bytes) {
      return;  // the disk tier's spill reports a damaged header; nothing to write
    }
    payload_bytes = header.payload_bytes;
  }
  remote::ManifestHeader h = remote::manifest_header_for(key);
  h.entry_class = static_cast<uint8_t>(e.entry_class);
  h.evidence = static_cast<uint8_t>(e.evidence);
  h.snapshot_required = ns.geometry.snapshot_required ? 1 : 0;
  h.block_tokens = ns.geometry.block_tokens;
  h.chain_tokens = ns.chain_tokens;
  h.position = e.position;
  h.anchor_chunks = e.anchor_chunks;
  h.block_payload_bytes = ns.geometry.block_payload_bytes;
  h.payload_checksum = e.payload_checksum;
  h.parent_hash = e.parent_hash;
  const remote::ImageView image{.tokens = extent + limits::entry_header_bytes,
                                .tokens_bytes = uint64_t{token_count} * sizeof(int32_t),
                                .payload = extent + shm::payload_offset_for(token_count),
                                .payload_bytes = payload_bytes,
                                .copy = shm::guarded_copy};
  table_.pin_io(slot);  // the worker reads the extent until the write completes
  if (!tier->put(key, h, image, slot, table_.entry_id(slot))) table_.unpin_io(slot);
}

RemoteMover::Probe RemoteMover::should_probe(NamespaceIndex ns, const wire::LookupRequest& req,
                                            Lease& lease) {
  RemoteTier* tier = remote_;
  if (tier == nullptr) return Probe::none;
  const NamespaceInfo& info = table_.namespace_info(ns);
  const uint32_t block_tokens = info.geometry.block_tokens;
  const auto snapshots = [&] {
    return should_probe_snapshots(ns, req, lease) ? Probe::snapshots : Probe::none;
  };
  // Where a snapshot decides what is restorable, the snapshot probe asks for the
  // blocks it needs too (remote_mover_snapshots.cpp).
  if (info.geometry.snapshot_required) return snapshots();
  // Single flight first: an engine already writing what follows will publish it here.
  if (!lease.inflight.empty()) return Probe::none;
  const size_t blocks_max = std::min<size_t>((req.prompt_tokens - 1) / block_tokens, req.chunk_hashes.size());
  const size_t first = lease.blocks.size();
  // The chain is here as far as the prompt goes: a tail snapshot past its last whole
  // block may be in the store.
  if (first >= blocks_max) return snapshots();
  // A block here but not sealed (another engine writes it): nothing to ask. One
  // known missing a moment ago ends the chain: a tail snapshot may continue it.
  if (table_.find_block(ns, req.chunk_hashes[first]) != no_slot) return Probe::none;
  if (tier->missed_recently(req.chunk_hashes[first], coarse_monotonic_usec())) return snapshots();
  if (!tier->probing_useful()) return Probe::none;
  lease.remote_pending = true;
  lease.inflight_tokens = static_cast<uint32_t>((blocks_max - first) * block_tokens);
  return Probe::blocks;
}

void RemoteMover::start_probe(Probe probe, ConnectionId id, uint64_t lease_id,
                              NamespaceIndex ns, const wire::LookupRequest& req,
                              const Lease& lease) {
  assert(probe != Probe::none);
  if (probe == Probe::snapshots) return start_snapshot_probe(id, lease_id, ns, req, lease);
  const NamespaceInfo& info = table_.namespace_info(ns);
  const size_t blocks_max =
      std::min<size_t>((req.prompt_tokens - 1) / info.geometry.block_tokens, req.chunk_hashes.size());
  std::vector<remote::EntryKey> keys;
  const size_t last = std::min(blocks_max, lease.blocks.size() + remote::probe_keys_max);
  for (size_t i = lease.blocks.size(); i < last; ++i) keys.push_back(block_key(info, req.chunk_hashes[i]));
  remote_->note_probe(id, lease_id, monotonic_usec());
  remote_->probe(std::move(keys), id, lease_id);
}

Lease* RemoteMover::find_lease(ConnectionId id, uint64_t lease_id) {
  return leases_.find_lease(id, lease_id);
}

void RemoteMover::expire_probes() {
  RemoteTier* tier = remote_;
  if (tier == nullptr) return;
  std::vector<std::pair<uint64_t, uint64_t>> expired;
  tier->take_expired_probes(monotonic_usec(), expired);
  for (const auto& [connection, lease_id] : expired) {
    // Over budget: a miss.
    if (Lease* lease = find_lease(static_cast<ConnectionId>(connection), lease_id))
      lease->remote_pending = false;
  }
}

void RemoteMover::take_completions() {
  RemoteTier* tier = remote_;
  if (tier == nullptr) return;
  std::vector<RemoteCompletion> done;
  tier->take_completions(done);
  for (const RemoteCompletion& d : done) {
    switch (d.kind) {
      case RemoteJobKind::Put: {
        const auto slot = static_cast<EntrySlot>(d.tag);
        assert(table_.entry_id(slot) == d.tag2 && "pinned entries keep their slot");
        table_.unpin_io(slot);
        break;
      }
      case RemoteJobKind::Probe:
        // Lease ids are never reused: a lease with a snapshot probe out asked for
        // these manifests (snapshots, and in hybrid namespaces blocks too).
        if (snapshot_probes_.contains(d.tag2)) {
          finish_snapshot_manifests(d);
        } else {
          finish_probe(d);
        }
        break;
      case RemoteJobKind::Index: finish_snapshot_index(d); break;
      case RemoteJobKind::Get: finish_get(d); break;
      case RemoteJobKind::Remove:
      case RemoteJobKind::Refresh: break;
    }
  }
}

void RemoteMover::finish_probe(const RemoteCompletion& done) {
  NamespaceIndex ns = 0;
  const auto connection = static_cast<ConnectionId>(done.tag);
  if (!leases_.connection_namespace(connection, &ns) || done.results.empty()) return;
  // The lease may be gone (an engine that did not wait): what the store has is still
  // brought in for the next lookup of this chain, but no lease waits for it.
  Lease* lease = find_lease(connection, done.tag2);
  if (lease != nullptr) lease->remote_pending = false;
  (void)promote_blocks(ns, done.keys, done.results, UINT32_MAX, true, lease);
}

uint32_t RemoteMover::promote_blocks(NamespaceIndex ns, std::span<const remote::EntryKey> keys,
                                     std::span<const remote::ProbeResult> results, uint32_t limit,
                                     bool fetch, Lease* lease) {
  assert(keys.size() == results.size());
  if (results.empty()) return 0;
  const NamespaceInfo& info = table_.namespace_info(ns);
  const uint32_t block_tokens = info.geometry.block_tokens;
  // The chain continues from a sealed block here (or the namespace seed): the first
  // manifest names which, and must agree.
  if (results[0].status != Status::Ok) {
    const remote::ProbeResult& r = results[0];
    if (r.status == Status::NotFound || r.status == Status::Corrupt) {
      remote_->note_missed(keys[0].key_hash, coarse_monotonic_usec());
    }
    return 0;
  }
  uint32_t index = results[0].manifest.header.anchor_chunks;
  Hash128 parent = info.id;
  if (index > 0) {
    const EntrySlot before = table_.find_block(ns, results[0].manifest.header.parent_hash);
    if (before == no_slot || !table_.entry(before).sealed || table_.entry(before).dead ||
        table_.entry(before).anchor_chunks + 1 != index) {
      ++counters_.remote_rejected;  // not the continuation of a chain this daemon has
      return 0;
    }
    parent = table_.entry(before).key_hash;
  }
  // Queued together at the end, so that the worker pipelines them.
  std::vector<RemoteTier::GetItem> gets;
  for (size_t i = 0; i < results.size() && index < limit; ++i, ++index) {
    const remote::ProbeResult& r = results[i];
    const Hash128 hash = keys[i].key_hash;
    if (r.status != Status::Ok) {
      if (r.status == Status::NotFound || r.status == Status::Corrupt) {
        remote_->note_missed(hash, coarse_monotonic_usec());
      }
      break;
    }
    const remote::ManifestHeader& h = r.manifest.header;
    // A value under the right key but not of this chain or geometry is a miss.
    if (h.kind != static_cast<uint8_t>(EntryKind::Block) || h.parent_hash != parent ||
        h.anchor_chunks != index || h.block_tokens != block_tokens ||
        h.token_count != block_tokens || h.chain_tokens != info.chain_tokens ||
        h.snapshot_required != (info.geometry.snapshot_required ? 1 : 0) ||
        h.payload_bytes != info.geometry.block_payload_bytes ||
        h.position != (index + 1) * block_tokens || h.entry_class > entry_class_max ||
        h.evidence > evidence_max) {
      ++counters_.remote_rejected;
      break;
    }
    // Load versus recompute, by the store's measured bandwidth and the engine's rate.
    const double rate = info.prefill_tokens_per_second != 0 ? info.prefill_tokens_per_second
                                                             : prefill_tokens_per_second_default;
    if (!remote_->load_beats_recompute(r.manifest.image_bytes(), block_tokens / rate)) {
      ++counters_.recompute_instead;
      break;
    }
    EntrySlot slot = table_.find_block(ns, hash);
    if (slot != no_slot) {
      // Published here meanwhile, or being restored for another lookup: follow it.
      if (!table_.entry(slot).sealed && lease != nullptr) {
        lease->inflight.emplace_back(slot, table_.entry_id(slot));
      }
      parent = hash;
      continue;
    }
    if (!fetch) {
      parent = hash;
      continue;
    }
    const NewEntry n{.ns = ns,
                     .kind = EntryKind::Block,
                     .key_hash = hash,
                     .parent_hash = parent,
                     .extent_bytes = shm::extent_bytes_for(block_tokens, h.payload_bytes),
                     .position = h.position,
                     .anchor_chunks = index,
                     .entry_class = static_cast<EntryClass>(h.entry_class),
                     .evidence = static_cast<Evidence>(h.evidence),
                     .reserved_by = remote_connection_id};
    remote::ImageTarget target;
    // No room (the rest is prefilled), or a page taken away.
    if (!reserve_for_fetch(n, block_tokens, h.payload_bytes, &slot, &target)) break;
    gets.push_back({.key = keys[i], .manifest = r.manifest, .target = target, .tag = slot,
                    .tag2 = table_.entry_id(slot)});
    if (lease != nullptr) lease->inflight.emplace_back(slot, table_.entry_id(slot));
    parent = hash;
  }
  if (!gets.empty()) remote_->get_all(std::move(gets));
  return index;
}

void RemoteMover::finish_get(const RemoteCompletion& done) {
  const auto slot = static_cast<EntrySlot>(done.tag);
  assert(table_.entry_id(slot) == done.tag2 && "pinned entries keep their slot");
  table_.unpin_io(slot);
  const Entry& e = table_.entry(slot);
  assert(!e.sealed && e.reserved_by == remote_connection_id);
  bool good = done.status == Status::Ok;
  if (good && e.kind == EntryKind::Snapshot) {
    // The tail is the one its index field named and the reservation was made for
    // (the key's digest is of it, and the manifest named the key).
    std::vector<int32_t> tail(e.tail_tokens.size());
    good = tail.empty() ||
           (shm::guarded_copy(tail.data(),
                              arena_data_ + e.extent_offset + limits::entry_header_bytes,
                              tail.size() * sizeof(int32_t)) &&
            std::equal(tail.begin(), tail.end(), e.tail_tokens.begin(), e.tail_tokens.end()));
    if (!good) {
      ++counters_.remote_rejected;
      log_warning_limited("kvparkd: a remote snapshot's tail tokens are not its key's; dropped");
    }
  } else if (good) {
    // The tokens are the ones the key names: h = XXH3-128(parent || tokens).
    const NamespaceInfo& info = table_.namespace_info(e.ns);
    std::vector<int32_t> tokens(info.geometry.block_tokens);
    good = shm::guarded_copy(tokens.data(), arena_data_ + e.extent_offset + limits::entry_header_bytes,
                             tokens.size() * sizeof(int32_t)) &&
           remote::block_chain_hash(e.parent_hash, tokens) == e.key_hash;
    if (!good) {
      ++counters_.remote_rejected;
      log_warning_limited("kvparkd: a remote entry's token ids do not hash to its key; dropped");
    }
  }
  if (!good) {
    table_.erase(slot);  // followers see it gone and prefill
    return;
  }
  table_.seal(slot, done.payload_checksum, coarse_monotonic_usec());
  ++counters_.remote_promotions;
  counters_.remote_promotion_bytes += e.extent_bytes;
  // On to disk by the disk policy, as if published here.
  if (TieringPolicy::write_through(table_.entry(slot))) (void)disk_.spill_chain(slot, 0);
}

}  // namespace kvpark::daemon
