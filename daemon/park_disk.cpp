// Park's disk policy: write-through, low-water demotion, promotion on lookup,
// capacity eviction, flushes and recovery (see park.h for the policy).
#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <ctime>

#include "daemon/clock.h"
#include "daemon/disk_tier.h"
#include "daemon/log.h"
#include "daemon/park.h"
#include "proto/limits.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {

namespace {

// What an entry with a disk copy is worth keeping on the host, relative to one without.
constexpr double disk_copy_value_share = 0.1;

// Below this many bytes a busy period says more about latency than bandwidth.
constexpr uint64_t bandwidth_sample_bytes_min = 1ull << 20;

// How much more a kind of evidence says "this will be asked for again".
double evidence_weight(Evidence evidence) {
  switch (evidence) {
    case Evidence::ExplicitBreakpoint: return 4.0;
    case Evidence::ObservedRecurrence: return 3.0;  // counts as shared, seen twice
    case Evidence::RequestedAutomatic: return 2.0;
    case Evidence::EngineStructural: return 2.0;
    case Evidence::DefaultAutomatic: return 1.0;
  }
  return 1.0;
}

}  // namespace

bool Park::worth_keeping(const Entry& e) const {
  // Spill what was reused, is shared, was asked for, or is a conversation's fresh
  // turn (its session is likely to return); not every old one-off.
  const uint64_t age = coarse_monotonic_usec() - std::min(e.last_use_usec, coarse_monotonic_usec());
  return e.entry_class == EntryClass::Shared || e.hits > 0 ||
         e.evidence != Evidence::DefaultAutomatic || age < private_keep_usec;
}

double Park::value_density(const Entry& e, uint64_t now) const {
  const NamespaceInfo& ns = table_.namespace_info(e.ns);
  const double rate = ns.prefill_tokens_per_second != 0 ? ns.prefill_tokens_per_second
                                                        : prefill_tokens_per_second_default;
  // A block saves its own tokens; a snapshot makes everything up to its position
  // restorable (for snapshot-required engines nothing restores without one).
  const double tokens = e.kind == EntryKind::Block ? ns.geometry.block_tokens : e.position;
  const bool shared = e.entry_class == EntryClass::Shared ||
                      e.evidence == Evidence::ObservedRecurrence;
  const double age = static_cast<double>(now - std::min(e.last_use_usec, now));
  const double half_life = shared ? shared_half_life_usec : private_half_life_usec;
  const double likelihood = (1.0 + static_cast<double>(e.hits)) * std::exp2(-age / half_life);
  const double weight = evidence_weight(e.evidence) * (shared ? 2.0 : 1.0);
  // Dropping the host copy of an entry that is safe on disk loses only a promotion.
  const double tier = e.on_disk ? disk_copy_value_share : 1.0;
  return tokens / rate * weight * likelihood * tier / static_cast<double>(e.extent_bytes);
}

bool Park::load_beats_recompute(const Entry& e) const {
  if (disk_read_bytes_per_second_ <= 0) return true;  // not measured yet: try the disk
  const NamespaceInfo& ns = table_.namespace_info(e.ns);
  const double rate = ns.prefill_tokens_per_second != 0 ? ns.prefill_tokens_per_second
                                                        : prefill_tokens_per_second_default;
  const double tokens = e.kind == EntryKind::Block ? ns.geometry.block_tokens : e.position;
  return static_cast<double>(e.extent_bytes) / disk_read_bytes_per_second_ < tokens / rate;
}

EntrySlot Park::chain_parent(const Entry& e, bool* ret_gone) const {
  if (ret_gone != nullptr) *ret_gone = false;
  if (e.kind != EntryKind::Block || e.anchor_chunks == 0) return no_slot;
  const EntrySlot parent = table_.find_block(e.ns, e.parent_hash);
  const bool gone = parent == no_slot || table_.entry(parent).dead || !table_.entry(parent).sealed;
  if (ret_gone != nullptr) *ret_gone = gone;
  return gone ? no_slot : parent;
}

bool Park::spill_chain(EntrySlot slot, uint64_t flush_job) {
  DiskTier* disk = options_.disk;
  if (disk == nullptr || disk->read_only()) return false;
  // Walk up to the first predecessor that is durable or being written; spill the
  // rest top-down so each record's predecessor is ahead of it.
  std::vector<EntrySlot> chain = {slot};
  for (EntrySlot cur = slot;;) {
    bool gone = false;
    const EntrySlot parent = chain_parent(table_.entry(cur), &gone);
    if (gone) return false;  // nothing could ever reach it on disk
    if (parent == no_slot || table_.entry(parent).on_disk || spilling(parent)) break;
    if (!table_.host_readable(table_.entry(parent))) return false;
    chain.push_back(parent);
    cur = parent;
  }
  bool started = false;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    const Entry& e = table_.entry(*it);
    if (e.on_disk || spilling(*it)) continue;
    // Only the entry asked for counts toward a flush; its predecessors are counted
    // where the flush meets them (already written by then, or not part of it).
    if (!start_spill(*it, *it == slot ? flush_job : 0, flush_job != 0)) return started;
    started = true;
  }
  return started;
}

bool Park::start_spill(EntrySlot slot, uint64_t flush_job, bool budget_exempt) {
  DiskTier* disk = options_.disk;
  const Entry& e = table_.entry(slot);
  if (disk == nullptr || disk->read_only() || !table_.host_readable(e) || e.on_disk ||
      e.io_pins > 0 || e.dead) {
    return false;
  }
  // The chain first: a record its predecessor's record does not lead to is unreachable.
  bool parent_gone = false;
  const EntrySlot parent = chain_parent(e, &parent_gone);
  if (parent_gone ||
      (parent != no_slot && !table_.entry(parent).on_disk && !spilling(parent))) {
    return false;
  }
  // A flush is the operator's explicit request; only background spills obey the budget.
  if (!budget_exempt && !disk->budget_allows(e.extent_bytes)) {
    ++counters_.budget_refusals;
    return false;
  }
  // Pair check with the header this daemon wrote at reserve before trusting its sizes.
  shm::EntryHeader h{};
  if (!shm::guarded_copy(&h, options_.arena_data + e.extent_offset, sizeof h)) {
    log_arena_fault(e.extent_offset);
    h = shm::EntryHeader{};  // fails the check below
  }
  if (h.magic != shm::entry_magic || h.key_hash != e.key_hash ||
      uint64_t{h.payload_offset} + h.payload_bytes > e.extent_bytes) {
    ++counters_.spill_failures;
    log_warning_limited("kvparkd: not spilling entry %llx: its arena header is damaged",
                        static_cast<unsigned long long>(table_.entry_id(slot)));
    return false;
  }
  disk->charge(e.extent_bytes);
  table_.pin_io(slot);
  const uint64_t job = disk->spill(e, table_.namespace_info(e.ns), h.payload_bytes,
                                   options_.arena_data + e.extent_offset);
  jobs_[job] = DiskJob{.spill = true, .start_usec = monotonic_usec(), .slot = slot,
                       .entry_id = table_.entry_id(slot), .flush_job = flush_job};
  spilling_.insert(slot);
  ++spills_in_flight_;
  return true;
}

bool Park::start_promotion(EntrySlot slot) {
  DiskTier* disk = options_.disk;
  const Entry& e = table_.entry(slot);
  if (disk == nullptr || !e.on_disk || e.on_host || e.io_pins > 0) return false;
  if (table_.begin_promotion(slot) != Status::Ok) return false;
  table_.pin_io(slot);
  const uint64_t job = disk->restore(e, table_.namespace_info(e.ns),
                                     options_.arena_data + e.extent_offset);
  jobs_[job] = DiskJob{.spill = false, .start_usec = monotonic_usec(), .slot = slot,
                       .entry_id = table_.entry_id(slot)};
  if (promotions_in_flight_++ == 0) {
    promotion_busy_since_usec_ = monotonic_usec();
    promotion_busy_bytes_ = 0;
  }
  return true;
}

void Park::remove_from_disk(EntrySlot slot) {
  const Entry& e = table_.entry(slot);
  assert(e.on_disk && options_.disk != nullptr);
  options_.disk->remove(e, table_.namespace_info(e.ns));  // a no-op when read-only
  (void)table_.detach_disk_record(slot);  // erases an entry left on no tier
}

void Park::enforce_disk_capacity() {
  DiskTier* disk = options_.disk;
  if (disk == nullptr || disk->capacity_bytes() == 0 || disk->read_only()) return;
  while (table_.disk_bytes() > disk->capacity_bytes()) {
    const EntrySlot slot = table_.disk_lru_tail();
    if (slot == no_slot) break;
    remove_from_disk(slot);
    table_.count_disk_eviction();
  }
}

void Park::on_disk_completions() {
  DiskTier* disk = options_.disk;
  if (disk == nullptr) return;
  std::vector<disk::DiskCompletion> done;
  disk->store().take_completions(done);
  bool promotions_finished = false;
  for (const disk::DiskCompletion& d : done) {
    auto it = jobs_.find(d.job_id);
    if (it == jobs_.end()) continue;  // a removal's cancelled spill, already forgotten
    const DiskJob job = it->second;
    jobs_.erase(it);
    assert(table_.entry_id(job.slot) == job.entry_id && "pinned entries keep their slot");
    if (job.spill) {
      --spills_in_flight_;
      const Entry& e = table_.entry(job.slot);
      const EntrySlot parent = chain_parent(e, nullptr);
      if (d.status == Status::Ok && parent != no_slot && !table_.entry(parent).on_disk) {
        // Durable before its predecessor: not reported until that one is (or is dropped
        // if that one fails). It stays pinned meanwhile.
        waiting_spills_.push_back({.job = job, .bytes = d.bytes});
        continue;
      }
      finish_spill(job, d.status, d.bytes, d.err);
      continue;
    }
    table_.unpin_io(job.slot);
    promotions_finished = true;
    if (--promotions_in_flight_ == 0 && promotion_busy_bytes_ + table_.entry(job.slot).extent_bytes >=
                                            bandwidth_sample_bytes_min) {
      // A busy period ended: its bytes over its duration is what the device delivered.
      const uint64_t bytes = promotion_busy_bytes_ + table_.entry(job.slot).extent_bytes;
      const uint64_t took = std::max<uint64_t>(monotonic_usec() - promotion_busy_since_usec_, 1);
      const double sample = static_cast<double>(bytes) * 1e6 / static_cast<double>(took);
      disk_read_bytes_per_second_ = disk_read_bytes_per_second_ <= 0
                                        ? sample
                                        : 0.7 * disk_read_bytes_per_second_ + 0.3 * sample;
    }
    const Entry& e = table_.entry(job.slot);
    bool good = d.status == Status::Ok;
    if (good) {
      // The image carries the header of the incarnation that wrote it: check it names
      // this entry, then stamp it with ours.
      shm::EntryHeader h{};
      if (!shm::guarded_copy(&h, options_.arena_data + e.extent_offset, sizeof h)) {
        log_arena_fault(e.extent_offset);
        h = shm::EntryHeader{};  // fails the check below
      }
      const uint32_t tokens = e.kind == EntryKind::Block
                                  ? table_.namespace_info(e.ns).geometry.block_tokens
                                  : static_cast<uint32_t>(e.tail_tokens.size());
      good = h.magic == shm::entry_magic && h.format_version == shm::entry_format_version &&
             h.kind == static_cast<uint8_t>(e.kind) &&
             h.namespace_id == table_.namespace_info(e.ns).id && h.key_hash == e.key_hash &&
             h.token_count == tokens && h.position == e.position &&
             shm::extent_bytes_for(tokens, h.payload_bytes) == e.extent_bytes;
      if (good) {
        const shm::EntryHeader fresh = make_entry_header(e, tokens, h.payload_bytes);
        good = shm::guarded_copy(options_.arena_data + e.extent_offset, &fresh, sizeof fresh);
        if (!good) log_arena_fault(e.extent_offset);
      }
    }
    table_.finish_promotion(job.slot, good);
    if (good) {
      counters_.promotion_seconds.observe(static_cast<double>(monotonic_usec() - job.start_usec) /
                                          1e6);
      ++counters_.promotions;
      counters_.promotion_bytes += e.extent_bytes;
      promotion_busy_bytes_ += e.extent_bytes;
    } else if (d.status == Status::Corrupt || d.status == Status::Ok) {
      // Never served: the record goes, and the entry with it.
      ++counters_.checksum_failures;
      log_warning_limited("kvparkd: disk record of entry %llx failed verification; dropped",
                          static_cast<unsigned long long>(job.entry_id));
      disk->remove(e, table_.namespace_info(e.ns));
      table_.kill(job.slot);
    } else {
      ++counters_.promotion_failures;
      log_warning_limited("kvparkd: restoring entry %llx from disk failed: %s (%s)",
                          static_cast<unsigned long long>(job.entry_id),
                          std::string(status_name(d.status)).c_str(), strerror(d.err));
    }
  }
  settle_waiting_spills();
  enforce_disk_capacity();
  if (promotions_finished) answer_waiters(false);
  advance_flush();
}

void Park::finish_spill(const DiskJob& job, Status status, uint64_t bytes, int err) {
  table_.unpin_io(job.slot);
  spilling_.erase(job.slot);
  bool parent_gone = false;
  const EntrySlot parent = chain_parent(table_.entry(job.slot), &parent_gone);
  if (status == Status::Ok && (parent_gone || (parent != no_slot && !table_.entry(parent).on_disk))) {
    // Its predecessor never became durable: the record could not be reached after a
    // restart, so it goes now.
    const Entry& e = table_.entry(job.slot);
    options_.disk->remove(e, table_.namespace_info(e.ns));
    ++counters_.chain_spills_dropped;
    status = Status::NotFound;
  }
  if (status == Status::Ok) {
    table_.attach_disk_record(job.slot, bytes);
    counters_.spill_seconds.observe(static_cast<double>(monotonic_usec() - job.start_usec) / 1e6);
    ++counters_.spills;
    counters_.spill_bytes += bytes;
  } else if (status != Status::NotFound) {
    ++counters_.spill_failures;
    log_warning_limited("kvparkd: spill of entry %llx failed: %s (%s); it stays in memory",
                        static_cast<unsigned long long>(job.entry_id),
                        std::string(status_name(status)).c_str(), strerror(err));
  }
  if (job.flush_job != 0 && job.flush_job == flush_.job_id) {
    ++flush_.entries_done;
    flush_.bytes_done += table_.entry(job.slot).extent_bytes;
    if (status != Status::Ok && status != Status::NotFound) flush_.status = status;
  }
  // Demotion under pressure: once the copy is safe, the host copy can go.
  const Entry& e = table_.entry(job.slot);
  if (status == Status::Ok && table_.bytes_free() < low_water_bytes_ && e.on_lru) {
    table_.evict_host(job.slot);
  }
}

void Park::settle_waiting_spills() {
  // Each pass settles the entries whose predecessor settled in the last one.
  for (bool progress = true; progress && !waiting_spills_.empty();) {
    progress = false;
    for (size_t i = 0; i < waiting_spills_.size();) {
      const WaitingSpill w = waiting_spills_[i];
      bool gone = false;
      const EntrySlot parent = chain_parent(table_.entry(w.job.slot), &gone);
      if (!gone && parent != no_slot && !table_.entry(parent).on_disk && spilling(parent)) {
        ++i;  // its predecessor is still being written
        continue;
      }
      waiting_spills_[i] = waiting_spills_.back();
      waiting_spills_.pop_back();
      finish_spill(w.job, Status::Ok, w.bytes, 0);
      progress = true;
    }
  }
}

void Park::keep_low_water() {
  if (low_water_bytes_ == 0) return;
  DiskTier* disk = options_.disk;
  EntrySlot slot = table_.host_lru_tail();
  while (slot != no_slot && table_.bytes_free() < low_water_bytes_) {
    const EntrySlot older_than_next = table_.host_lru_prev(slot);
    const Entry& e = table_.entry(slot);
    if (disk != nullptr && !disk->read_only() && !e.on_disk && worth_keeping(e)) {
      // Worth a disk write: demote (the host copy goes when the spill completes),
      // predecessors first so the record stays reachable.
      if (spills_in_flight_ < spills_in_flight_max) (void)spill_chain(slot, 0);
    } else {
      table_.evict_host(slot);
    }
    slot = older_than_next;
  }
}

Status Park::start_flush(bool everything, uint64_t& ret_job_id) {
  if (options_.disk == nullptr) return Status::BadState;
  if (!flush_.done) {
    ret_job_id = flush_.job_id;
    return Status::Ok;
  }
  flush_ = FlushState{.job_id = next_flush_id_++, .done = false};
  flush_queue_.clear();
  for (EntrySlot slot = 0; slot < table_.slot_count(); ++slot) {
    const Entry& e = table_.entry(slot);
    if (!e.in_use || e.dead || !table_.host_readable(e) || e.on_disk) continue;
    if (!everything && !worth_keeping(e)) continue;
    flush_queue_.push_back(slot);
    ++flush_.entries_total;
    flush_.bytes_total += e.extent_bytes;
  }
  ret_job_id = flush_.job_id;
  advance_flush();
  return Status::Ok;
}

void Park::advance_flush() {
  if (flush_.done) return;
  while (!flush_queue_.empty() && spills_in_flight_ < spills_in_flight_max) {
    const EntrySlot slot = flush_queue_.back();
    flush_queue_.pop_back();
    const Entry& e = table_.entry(slot);
    // Evicted or written meanwhile: nothing left to do for it.
    if (!e.in_use || e.on_disk || spilling(slot) || !spill_chain(slot, flush_.job_id)) {
      ++flush_.entries_done;
      flush_.bytes_done += e.extent_bytes;
    }
  }
  bool flush_spills = false;
  for (const auto& [id, job] : jobs_) flush_spills = flush_spills || job.flush_job == flush_.job_id;
  for (const WaitingSpill& w : waiting_spills_) {
    flush_spills = flush_spills || w.job.flush_job == flush_.job_id;
  }
  if (flush_queue_.empty() && !flush_spills) flush_.done = true;
}

std::vector<const disk::RecordInfo*> Park::reachable_records(const disk::RecoveryReport& report,
                                                             std::vector<const disk::RecordInfo*>& ret_unreachable) {
  // Chain order: a block is reachable when its predecessor's record is (the chain's
  // first block: when its parent is the namespace seed); a snapshot of a block
  // namespace when its anchor block is; snapshot-only namespaces hash their chain
  // from the prompt alone, so their snapshots always are.
  std::vector<const disk::RecordInfo*> order;
  order.reserve(report.records.size());
  for (const disk::RecordInfo& r : report.records) order.push_back(&r);
  std::sort(order.begin(), order.end(), [](const disk::RecordInfo* a, const disk::RecordInfo* b) {
    const bool a_block = a->header.kind == static_cast<uint8_t>(EntryKind::Block);
    const bool b_block = b->header.kind == static_cast<uint8_t>(EntryKind::Block);
    if (a_block != b_block) return a_block;  // blocks first, snapshots after
    return a->header.anchor_chunks < b->header.anchor_chunks;
  });
  struct Key {
    NamespaceId ns;
    Hash128 hash;
    bool operator==(const Key&) const = default;
  };
  struct KeyHasher {
    size_t operator()(const Key& k) const noexcept {
      return Hash128Hasher{}(k.hash) ^ Hash128Hasher{}(k.ns);
    }
  };
  std::unordered_map<Key, uint32_t, KeyHasher> blocks;  // reachable block -> its chain index
  std::vector<const disk::RecordInfo*> reachable;
  for (const disk::RecordInfo* r : order) {
    const disk::RecordHeader& h = r->header;
    bool ok = false;
    if (h.kind == static_cast<uint8_t>(EntryKind::Block)) {
      if (h.anchor_chunks == 0) {
        ok = h.parent_hash == h.namespace_id;
      } else {
        auto it = blocks.find({h.namespace_id, h.parent_hash});
        ok = it != blocks.end() && it->second + 1 == h.anchor_chunks;
      }
      if (ok) blocks.emplace(Key{h.namespace_id, h.key_hash}, h.anchor_chunks);
    } else if (h.block_tokens == 0 || h.anchor_chunks == 0) {
      ok = true;
    } else {
      auto it = blocks.find({h.namespace_id, h.key_hash});
      ok = it != blocks.end() && it->second + 1 == h.anchor_chunks;
    }
    (ok ? reachable : ret_unreachable).push_back(r);
  }
  return reachable;
}

uint64_t Park::recover(const disk::RecoveryReport& report) {
  DiskTier* disk = options_.disk;
  assert(disk != nullptr);
  uint64_t skipped = 0;
  std::vector<const disk::RecordInfo*> unreachable;
  const std::vector<const disk::RecordInfo*> reachable = reachable_records(report, unreachable);
  for (const disk::RecordInfo* r : unreachable) {
    // No lookup can get to it: the crash came between its write and its predecessor's.
    if (!disk->read_only()) disk->store().remove(r->id);
    ++counters_.unreachable_records_removed;
    ++skipped;
  }
  for (const disk::RecordInfo* reachable_record : reachable) {
    const disk::RecordInfo& record = *reachable_record;
    const disk::RecordHeader& h = record.header;
    const Geometry geometry{.block_tokens = h.block_tokens,
                            .block_payload_bytes = h.block_payload_bytes,
                            .snapshot_required = h.snapshot_required != 0};
    NamespaceIndex ns = 0;
    std::vector<int32_t> tail;
    const bool snapshot = h.kind == static_cast<uint8_t>(EntryKind::Snapshot);
    bool usable =
        table_.register_namespace(h.namespace_id, geometry, 0, ns) == Status::Ok &&
        table_.namespace_info(ns).chain_tokens == h.chain_tokens &&
        (h.kind == static_cast<uint8_t>(EntryKind::Block) || snapshot) &&
        h.image_bytes == shm::extent_bytes_for(h.token_count, h.payload_bytes) &&
        h.entry_class <= entry_class_max && h.evidence <= evidence_max &&
        (!snapshot || disk->read_tail_tokens(record, tail));
    if (usable) {
      const EntrySlot found = snapshot ? table_.find_snapshot(ns, h.key_hash, tail)
                                       : table_.find_block(ns, h.key_hash);
      // An entry adopted on the host: this is its disk copy.
      if (found != no_slot && !table_.entry(found).on_disk &&
          table_.entry(found).payload_checksum == h.payload_checksum) {
        table_.attach_disk_record(found, record.file_bytes);
        continue;
      }
      usable = found == no_slot;
    }
    if (!usable) {
      ++skipped;
      continue;
    }
    NewEntry n{.ns = ns,
               .kind = static_cast<EntryKind>(h.kind),
               .key_hash = h.key_hash,
               .parent_hash = h.parent_hash,
               .tail_tokens = tail,
               .extent_bytes = h.image_bytes,
               .position = h.position,
               .anchor_chunks = h.anchor_chunks,
               .creator_session = h.creator_session,
               .payload_checksum = h.payload_checksum,
               .entry_class = static_cast<EntryClass>(h.entry_class),
               .evidence = static_cast<Evidence>(h.evidence)};
    EntrySlot slot = no_slot;
    (void)table_.insert_on_disk(n, record.file_bytes, slot);
  }
  enforce_disk_capacity();
  return skipped;
}

}  // namespace kvpark::daemon
