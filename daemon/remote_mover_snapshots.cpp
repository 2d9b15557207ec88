// The remote tier's traffic (remote_mover.h) where a snapshot decides what is restorable (snapshot-only
// namespaces, block_tokens == 0, and hybrid ones, blocks and a required snapshot),
// and for the tail snapshot past an attention-only chain's last whole block (the
// exact position of a llama.cpp state parked as blocks): which snapshots the store
// has for a lookup, and restoring one (docs/remote.md).
//
// An attention-only lookup asks only once its blocks are here as far as they go (the
// prompt's end, or a block the store does not have either): one anchor, the chain's
// end, for a tail that continues it.
//
// A snapshot is anchored at a chunk hash (the namespace id for anchor 0) and names
// its tail tokens; the store lists each anchor's snapshots in an index (field:
// position and tail digest; value: the tail tokens). A lookup whose deepest local
// snapshot leaves tokens to gain reads, in one pipelined batch, the indexes of the
// prompt's anchors from that depth on; then the manifests of the deepest usable
// snapshots listed (at most remote_snapshot_candidates_max, one batch); then the
// first whole one is reserved for the remote pseudo-connection (other engines see it
// in flight: single flight) and streamed in. A tail past the prompt's last whole
// chunk is compared here before anything is fetched; an earlier tail lies inside a
// chunk the daemon knows only by its hash, and the client's tail check after restore
// stays the last word. Once restored, the tail tokens in the extent must be the ones
// the index named and the key's digest covers, else the entry is erased: a miss,
// never a wrong byte. Every anchor asked is not asked again for
// remote_miss_memory_usec (the lookup that follows a WAIT finds the restore here).
//
// A hybrid snapshot at anchor j restores only over blocks [0, j): anchors past the
// blocks here are asked only while the store may have the blocks between (the first
// one missing was not a miss a moment ago), and the manifests of the blocks missing
// up to the deepest candidate's anchor go in the same batch as the candidates'. Those
// blocks are fetched only up to the anchor of the snapshot chosen, and a snapshot is
// chosen only where the blocks under it are here or on their way: blocks without
// their snapshot would restore nothing.
#include <algorithm>
#include <cassert>
#include <span>

#include "daemon/clock.h"
#include "daemon/entry_header.h"
#include "daemon/remote_mover.h"
#include "daemon/remote_tier.h"
#include "daemon/value_model.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {
namespace {

// Manifests one lookup asks for at once, best first: a store that evicted the best
// one's manifest still serves the next in the same round trip.
constexpr size_t remote_snapshot_candidates_max = 4;

const Hash128& anchor_hash(const NamespaceInfo& info, std::span<const Hash128> chunk_hashes,
                           uint32_t j) {
  return j == 0 ? info.id : chunk_hashes[j - 1];
}

// Blocks and a required snapshot: a snapshot restores only over the blocks under it.
bool hybrid(const NamespaceInfo& info) {
  return info.geometry.snapshot_required && info.geometry.block_tokens > 0;
}

}  // namespace

uint32_t RemoteMover::sealed_blocks_from(NamespaceIndex ns, std::span<const Hash128> chunk_hashes,
                                  uint32_t first) const {
  uint32_t i = first;
  for (; i < chunk_hashes.size(); ++i) {
    const EntrySlot slot = table_.find_block(ns, chunk_hashes[i]);
    if (slot == no_slot || !table_.entry(slot).sealed || table_.entry(slot).dead) break;
  }
  return i;
}

uint32_t RemoteMover::snapshot_anchors(NamespaceIndex ns, const wire::LookupRequest& req,
                                       const Lease& lease, std::vector<uint32_t>& ret_anchors) {
  ret_anchors.clear();
  const NamespaceInfo& info = table_.namespace_info(ns);
  uint32_t local = 0;
  for (EntrySlot slot : lease.snapshots) local = std::max(local, table_.entry(slot).position);
  const auto chunks = static_cast<uint32_t>(req.chunk_hashes.size());
  const uint64_t now = coarse_monotonic_usec();
  if (!info.geometry.snapshot_required) {
    // Attention-only: a tail continuing the blocks here, unless one is here already.
    const auto blocks = static_cast<uint32_t>(lease.blocks.size());
    const uint32_t block_depth = blocks * info.geometry.block_tokens;
    if (local > block_depth || block_depth + 1 >= req.prompt_tokens) return std::max(local, block_depth);
    if (!remote_->missed_recently(anchor_hash(info, req.chunk_hashes, blocks), now))
      ret_anchors.push_back(blocks);
    return block_depth;
  }
  if (local + 1 >= req.prompt_tokens) return local;  // nothing deeper could be used
  // A snapshot at anchor j lies in [j * chain, (j + 1) * chain); the last anchor can
  // serve only a tail shorter than the prompt's.
  uint32_t deepest = req.tail_tokens.empty() ? chunks - 1 : chunks;
  const uint32_t shallowest = local / info.chain_tokens;
  if (hybrid(info)) {
    // Hybrid: a snapshot past the blocks here needs the ones between from the store;
    // the block the chain stops at being a recent miss rules every deeper anchor out.
    const uint32_t here = sealed_blocks_from(ns, req.chunk_hashes, static_cast<uint32_t>(lease.blocks.size()));
    if (here < chunks && remote_->missed_recently(req.chunk_hashes[here], now)) {
      deepest = std::min(deepest, here);
    }
  }
  for (uint32_t j = deepest + 1; j-- > shallowest && ret_anchors.size() < remote::probe_keys_max;) {
    if (!remote_->missed_recently(anchor_hash(info, req.chunk_hashes, j), now)) {
      ret_anchors.push_back(j);
    }
  }
  return local;
}

bool RemoteMover::should_probe_snapshots(NamespaceIndex ns, const wire::LookupRequest& req,
                                         Lease& lease) {
  // Single flight first: an engine (or a restore) already writing a snapshot past
  // the local ones will seal it here.
  if (!lease.inflight.empty()) return false;
  std::vector<uint32_t> anchors;
  const uint32_t local = snapshot_anchors(ns, req, lease, anchors);
  if (anchors.empty() || !remote_->probing_useful()) return false;
  lease.remote_pending = true;
  lease.inflight_tokens = req.prompt_tokens - 1 - local;
  return true;
}

void RemoteMover::start_snapshot_probe(ConnectionId id, uint64_t lease_id, NamespaceIndex ns,
                                       const wire::LookupRequest& req, const Lease& lease) {
  const NamespaceInfo& info = table_.namespace_info(ns);
  SnapshotProbe p{.connection = id,
                        .ns = ns,
                        .prompt_tokens = req.prompt_tokens,
                        .chunks = static_cast<uint32_t>(req.chunk_hashes.size()),
                        .tail_tokens = req.tail_tokens};
  p.local_depth = snapshot_anchors(ns, req, lease, p.anchors);
  assert(!p.anchors.empty() && "should_probe_snapshots said there is something to ask");
  if (hybrid(info)) {
    // Deepest first: the first anchor asked bounds the blocks a candidate can need.
    p.chunk_hashes.assign(req.chunk_hashes.begin(), req.chunk_hashes.begin() + p.anchors[0]);
  }
  std::vector<remote::EntryKey> keys;
  for (uint32_t j : p.anchors)
    keys.push_back({.ns = info.id, .key_hash = anchor_hash(info, req.chunk_hashes, j)});
  snapshot_probes_[lease_id] = std::move(p);
  remote_->note_probe(id, lease_id, monotonic_usec());
  remote_->probe_index(std::move(keys), id, lease_id);
}

void RemoteMover::end_snapshot_probe(uint64_t lease_id) {
  auto it = snapshot_probes_.find(lease_id);
  assert(it != snapshot_probes_.end());
  if (Lease* lease = find_lease(it->second.connection, lease_id)) lease->remote_pending = false;
  snapshot_probes_.erase(it);
}

void RemoteMover::finish_snapshot_index(const RemoteCompletion& done) {
  auto it = snapshot_probes_.find(done.tag2);
  if (it == snapshot_probes_.end()) return;
  SnapshotProbe& p = it->second;
  assert(done.indexes.size() == p.anchors.size() && done.keys.size() == p.anchors.size());
  const NamespaceInfo& info = table_.namespace_info(p.ns);
  const uint32_t chain = info.chain_tokens;
  const uint64_t now = coarse_monotonic_usec();
  struct Found {
    size_t index = 0;   // of the anchor asked
    size_t member = 0;  // in its index
    uint32_t position = 0;
  };
  std::vector<Found> found;
  for (size_t i = 0; i < done.indexes.size(); ++i) {
    const remote::IndexResult& r = done.indexes[i];
    if (r.status == Status::Unavailable) continue;  // that node is down: ask again later
    remote_->note_missed(done.keys[i].key_hash, now);
    const uint32_t j = p.anchors[i];
    for (size_t m = 0; m < r.members.size(); ++m) {
      const std::vector<int32_t>& tail = r.members[m].tail_tokens;
      const uint32_t position = r.members[m].key.position;
      // Of this anchor, deeper than what is here, short of the prompt's end; at the
      // last anchor, a prefix of the prompt's tail (earlier tails: the client checks).
      if (tail.size() >= chain || position != uint64_t{j} * chain + tail.size() ||
          position <= p.local_depth || position >= p.prompt_tokens) {
        continue;
      }
      if (j == p.chunks && !std::equal(tail.begin(), tail.end(), p.tail_tokens.begin())) continue;
      found.push_back({.index = i, .member = m, .position = position});
    }
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const Found& a, const Found& b) { return a.position > b.position; });
  Lease* lease = find_lease(p.connection, done.tag2);
  std::vector<remote::EntryKey> keys;
  for (const Found& f : found) {
    const remote::IndexMember& m = done.indexes[f.index].members[f.member];
    const EntrySlot slot = table_.find_snapshot(p.ns, m.key.key_hash, m.tail_tokens);
    if (slot != no_slot) {
      // Here already: sealed (the lookup had it, or chose not to use it), or being
      // written by an engine or another lookup's restore: follow that one.
      if (table_.entry(slot).sealed) continue;
      if (lease != nullptr && keys.empty()) {
        lease->inflight.emplace_back(slot, table_.entry_id(slot));
      }
      break;
    }
    keys.push_back(m.key);
    p.candidates.push_back({.anchor = m.key.key_hash,
                            .anchor_chunks = p.anchors[f.index],
                            .position = f.position,
                            .tail_tokens = m.tail_tokens});
    if (keys.size() >= remote_snapshot_candidates_max) break;
  }
  if (keys.empty()) {
    end_snapshot_probe(done.tag2);
    return;
  }
  if (hybrid(info)) {
    // The blocks not here up to the deepest candidate's anchor, in chain order
    // from the first one missing (those here past it are followed, not fetched).
    uint32_t deepest = 0;
    for (const SnapshotCandidate& cand : p.candidates) deepest = std::max(deepest, cand.anchor_chunks);
    p.blocks_first = sealed_blocks_from(p.ns, p.chunk_hashes, 0);
    for (uint32_t i = p.blocks_first; i < deepest; ++i) {
      keys.push_back({.ns = info.id, .key_hash = p.chunk_hashes[i]});
    }
  }
  remote_->probe(std::move(keys), done.tag, done.tag2);  // the lease still waits
}

void RemoteMover::finish_snapshot_manifests(const RemoteCompletion& done) {
  auto it = snapshot_probes_.find(done.tag2);
  if (it == snapshot_probes_.end()) return;
  const SnapshotProbe& p = it->second;
  const size_t candidates = p.candidates.size();
  assert(done.results.size() >= candidates && done.keys.size() == done.results.size());
  const NamespaceInfo& info = table_.namespace_info(p.ns);
  const bool blocks_under = hybrid(info);
  // Whole ones, best first. A manifest the store lost is a miss (the store cleared its
  // index field); a damaged one was deleted.
  std::vector<bool> whole(candidates, false);
  uint32_t anchor_needed = 0;  // the deepest whole candidate's
  for (size_t i = 0; i < candidates; ++i) {
    if (done.results[i].status != Status::Ok) continue;
    const SnapshotCandidate& cand = p.candidates[i];
    const remote::ManifestHeader& h = done.results[i].manifest.header;
    // A value under the right key but not of this geometry or anchor is a miss.
    if (h.kind != static_cast<uint8_t>(EntryKind::Snapshot) ||
        h.block_tokens != info.geometry.block_tokens ||
        h.snapshot_required != (info.geometry.snapshot_required ? 1 : 0) ||
        h.chain_tokens != info.chain_tokens || h.anchor_chunks != cand.anchor_chunks ||
        h.position != cand.position || h.token_count != cand.tail_tokens.size() ||
        h.payload_bytes == 0 || h.payload_bytes > limits::snapshot_payload_bytes_max ||
        h.entry_class > entry_class_max || h.evidence > evidence_max) {
      ++counters_.remote_rejected;
      continue;
    }
    whole[i] = true;
    anchor_needed = std::max(anchor_needed, cand.anchor_chunks);
  }
  Lease* lease = find_lease(p.connection, done.tag2);
  // Hybrid: how far the blocks here and in the store reach; a candidate anchored past
  // that restores nothing.
  uint32_t blocks_reached = UINT32_MAX;
  // The block manifests asked after the candidates' (hybrid namespaces only).
  const std::span<const remote::EntryKey> block_keys(done.keys.begin() + candidates, done.keys.end());
  const std::span<const remote::ProbeResult> block_results(done.results.begin() + candidates,
                                                           done.results.end());
  if (blocks_under) {
    blocks_reached = p.blocks_first;
    if (!block_results.empty() && anchor_needed > p.blocks_first) {
      if (block_results[0].status == Status::Ok &&
          block_results[0].manifest.header.anchor_chunks != p.blocks_first) {
        ++counters_.remote_rejected;  // not the block the chain stops at here
      } else {
        blocks_reached = std::max(p.blocks_first, promote_blocks(p.ns, block_keys, block_results,
                                                                        anchor_needed, false, lease));
      }
    }
  }
  size_t chosen = candidates;
  for (size_t i = 0; i < candidates && chosen == candidates; ++i) {
    if (whole[i] && p.candidates[i].anchor_chunks <= blocks_reached) chosen = i;
  }
  if (chosen == candidates) {
    end_snapshot_probe(done.tag2);
    return;
  }
  if (blocks_under && p.candidates[chosen].anchor_chunks > p.blocks_first) {
    // The blocks under the chosen one, and no more; a full arena that stops them short
    // leaves the snapshot unanchored, not fetched.
    const uint32_t anchor = p.candidates[chosen].anchor_chunks;
    if (promote_blocks(p.ns, block_keys, block_results, anchor, true, lease) < anchor) {
      end_snapshot_probe(done.tag2);
      return;
    }
  }
  const SnapshotCandidate& cand = p.candidates[chosen];
  const remote::Manifest& manifest = done.results[chosen].manifest;
  const remote::ManifestHeader& h = manifest.header;
  if (EntrySlot slot = table_.find_snapshot(p.ns, cand.anchor, cand.tail_tokens); slot != no_slot) {
    // Published or restored here meanwhile.
    if (!table_.entry(slot).sealed && lease != nullptr) {
      lease->inflight.emplace_back(slot, table_.entry_id(slot));
    }
    end_snapshot_probe(done.tag2);
    return;
  }
  // Load versus recompute, by the store's measured bandwidth and the engine's rate.
  const double rate = info.prefill_tokens_per_second != 0 ? info.prefill_tokens_per_second
                                                          : prefill_tokens_per_second_default;
  const auto tail = static_cast<uint32_t>(cand.tail_tokens.size());
  const uint64_t extent_bytes = shm::extent_bytes_for(tail, h.payload_bytes);
  if (!remote_->load_beats_recompute(manifest.image_bytes(),
                                     (cand.position - p.local_depth) / rate)) {
    ++counters_.recompute_instead;
  } else if (extent_bytes <= reservation_bytes_max_) {
    const NewEntry n{.ns = p.ns,
                     .kind = EntryKind::Snapshot,
                     .key_hash = cand.anchor,
                     .tail_tokens = cand.tail_tokens,
                     .extent_bytes = extent_bytes,
                     .position = cand.position,
                     .anchor_chunks = cand.anchor_chunks,
                     .entry_class = static_cast<EntryClass>(h.entry_class),
                     .evidence = static_cast<Evidence>(h.evidence),
                     .reserved_by = remote_connection_id};
    EntrySlot slot = no_slot;
    remote::ImageTarget target;
    // Not placed (no room, or a page taken away): the engine prefills.
    if (reserve_for_fetch(n, tail, h.payload_bytes, &slot, &target)) {
      remote_->get(done.keys[chosen], manifest, target, slot, table_.entry_id(slot));
      if (lease != nullptr) lease->inflight.emplace_back(slot, table_.entry_id(slot));
    }
  }
  end_snapshot_probe(done.tag2);
}

}  // namespace kvpark::daemon
