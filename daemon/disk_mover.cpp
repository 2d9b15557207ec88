// The disk plumbing (see disk_mover.h); recovery at start is disk_recovery.cpp.
#include "daemon/disk_mover.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "daemon/clock.h"
#include "daemon/disk_tier.h"
#include "daemon/entry_header.h"
#include "daemon/log.h"
#include "proto/limits.h"

namespace kvpark::daemon {

EntrySlot DiskMover::chain_parent(const Entry& e, bool* ret_gone) const {
  if (ret_gone != nullptr) *ret_gone = false;
  if (e.kind != EntryKind::Block || e.anchor_chunks == 0) return no_slot;
  const EntrySlot parent = table_.find_block(e.ns, e.parent_hash);
  const bool gone = parent == no_slot || table_.entry(parent).dead || !table_.entry(parent).sealed;
  if (ret_gone != nullptr) *ret_gone = gone;
  return gone ? no_slot : parent;
}

bool DiskMover::spill_chain(EntrySlot slot, uint64_t flush_job) {
  DiskTier* disk = disk_;
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

bool DiskMover::start_spill(EntrySlot slot, uint64_t flush_job, bool budget_exempt) {
  DiskTier* disk = disk_;
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
  // Pair check with the header this daemon wrote at reserve before trusting its sizes
  // (a page taken away reads as a zeroed header, which fails it).
  const shm::EntryHeader h = read_entry_header(arena_data_, e);
  if (h.magic != shm::entry_magic || h.key_hash != e.key_hash ||
      uint64_t{h.payload_offset} + h.payload_bytes > e.extent_bytes) {
    counters_.count_spill_failure(SpillFailure::damaged_header);
    log_warning_limited("kvparkd: not spilling entry %llx: its arena header is damaged",
                        static_cast<unsigned long long>(table_.entry_id(slot)));
    return false;
  }
  disk->charge(e.extent_bytes);
  table_.pin_io(slot);
  table_.hold_disk_predecessor(slot);
  const uint64_t job = disk->spill(e, table_.namespace_info(e.ns), h.payload_bytes,
                                   arena_data_ + e.extent_offset);
  jobs_[job] = DiskJob{.spill = true, .start_usec = monotonic_usec(), .slot = slot,
                       .entry_id = table_.entry_id(slot), .flush_job = flush_job};
  spilling_.insert(slot);
  ++spills_in_flight_;
  return true;
}

bool DiskMover::start_promotion(EntrySlot slot) {
  DiskTier* disk = disk_;
  const Entry& e = table_.entry(slot);
  if (disk == nullptr || !e.on_disk || e.on_host || e.io_pins > 0) return false;
  if (table_.begin_promotion(slot) != Status::Ok) return false;
  table_.pin_io(slot);
  const uint64_t job = disk->restore(e, table_.namespace_info(e.ns),
                                     arena_data_ + e.extent_offset);
  jobs_[job] = DiskJob{.spill = false, .start_usec = monotonic_usec(), .slot = slot,
                       .entry_id = table_.entry_id(slot)};
  policy_.promotion_started();
  return true;
}

void DiskMover::remove_from_disk(EntrySlot slot) {
  const Entry& e = table_.entry(slot);
  assert(e.on_disk && disk_ != nullptr);
  disk_->remove(e, table_.namespace_info(e.ns));  // a no-op when read-only
  (void)table_.detach_disk_record(slot);  // erases an entry left on no tier
}

void DiskMover::enforce_disk_capacity() {
  DiskTier* disk = disk_;
  if (disk == nullptr || disk->capacity_bytes() == 0 || disk->read_only()) return;
  while (table_.disk_bytes() > disk->capacity_bytes()) {
    const EntrySlot slot = table_.disk_lru_tail();
    if (slot == no_slot) break;
    remove_from_disk(slot);
    table_.count_disk_eviction();
  }
}

bool DiskMover::take_completions() {
  DiskTier* disk = disk_;
  if (disk == nullptr) return false;
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
    finish_promotion(job, d);
    promotions_finished = true;
  }
  settle_waiting_spills();
  enforce_disk_capacity();
  return promotions_finished;
}

void DiskMover::finish_promotion(const DiskJob& job, const disk::DiskCompletion& d) {
  table_.unpin_io(job.slot);
  policy_.promotion_completed(table_.entry(job.slot).extent_bytes);
  const Entry& e = table_.entry(job.slot);
  const bool good = d.status == Status::Ok && stamp_promoted_image(e);
  table_.finish_promotion(job.slot, good);
  if (good) {
    counters_.promotion_latency.observe(monotonic_usec() - job.start_usec);
    ++counters_.promotions;
    counters_.promotion_bytes += e.extent_bytes;
    policy_.promotion_delivered(e.extent_bytes);
  } else if (d.status == Status::Corrupt || d.status == Status::Ok) {
    // Never served: the record goes, and the entry with it.
    ++counters_.checksum_failures;
    log_warning_limited("kvparkd: disk record of entry %llx failed verification; dropped",
                        static_cast<unsigned long long>(job.entry_id));
    disk_->remove(e, table_.namespace_info(e.ns));
    table_.kill(job.slot);
  } else {
    ++counters_.promotion_failures;
    log_warning_limited("kvparkd: restoring entry %llx from disk failed: %s (%s)",
                        static_cast<unsigned long long>(job.entry_id),
                        std::string(status_name(d.status)).c_str(), strerror(d.err));
  }
}

bool DiskMover::stamp_promoted_image(const Entry& e) {
  // The image carries the header of the incarnation that wrote it: check it names
  // this entry, then stamp it with ours.
  const shm::EntryHeader h = read_entry_header(arena_data_, e);  // zeroed: names nothing
  const NamespaceInfo& info = table_.namespace_info(e.ns);
  if (!header_names_entry(h, e, info)) return false;
  return write_entry_header(
      arena_data_, e,
      make_entry_header(e, info, entry_token_count(e, info), h.payload_bytes, incarnation_));
}

void DiskMover::finish_spill(const DiskJob& job, Status status, uint64_t bytes, int err) {
  table_.unpin_io(job.slot);
  spilling_.erase(job.slot);
  bool parent_gone = false;
  const EntrySlot parent = chain_parent(table_.entry(job.slot), &parent_gone);
  if (status == Status::Ok && (parent_gone || (parent != no_slot && !table_.entry(parent).on_disk))) {
    // Its predecessor never became durable: the record could not be reached after a
    // restart, so it goes now.
    const Entry& e = table_.entry(job.slot);
    disk_->remove(e, table_.namespace_info(e.ns));
    ++counters_.chain_spills_dropped;
    status = Status::NotFound;
  }
  if (status == Status::Ok) {
    table_.attach_disk_record(job.slot, bytes);
    counters_.spill_latency.observe(monotonic_usec() - job.start_usec);
    ++counters_.spills;
    counters_.spill_bytes += bytes;
  } else {
    table_.release_disk_predecessor(job.slot);  // no record leads from it after all
  }
  if (status != Status::Ok && status != Status::NotFound) {
    counters_.count_spill_failure(spill_failure_of_errno(err));
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
  if (status == Status::Ok && policy_.below_low_water(table_.bytes_free()) && e.on_lru) {
    table_.evict_host(job.slot);
  }
}

void DiskMover::settle_waiting_spills() {
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

void DiskMover::keep_low_water() {
  if (policy_.low_water_bytes() == 0) return;
  DiskTier* disk = disk_;
  const bool disk_writable = disk != nullptr && !disk->read_only();
  const uint64_t now = coarse_monotonic_usec();
  EntrySlot slot = table_.host_lru_tail();
  while (slot != no_slot && policy_.below_low_water(table_.bytes_free())) {
    EntrySlot next = table_.host_lru_prev(slot);
    const Entry& e = table_.entry(slot);
    if (TieringPolicy::demotes(e, disk_writable, now)) {
      // Worth a disk write: demote (the host copy goes when the spill completes),
      // predecessors first so the record stays reachable.
      if (spills_in_flight_ < spills_in_flight_max) {
        (void)spill_chain(slot, 0);
        // The spills pin what they write, which leaves the list: `next` too, when it is
        // a predecessor sealed after this entry. Each time that happens the list is
        // shorter, so starting over from its cold end again ends.
        if (next != no_slot && !table_.entry(next).on_lru) next = table_.host_lru_tail();
      }
    } else {
      table_.evict_host(slot);
    }
    slot = next;
  }
}

Status DiskMover::start_flush(bool everything, uint64_t& ret_job_id) {
  if (disk_ == nullptr) return Status::BadState;
  if (!flush_.done) {
    ret_job_id = flush_.job_id;
    return Status::Ok;
  }
  flush_ = FlushState{.job_id = next_flush_id_++, .done = false};
  flush_queue_.clear();
  const uint64_t now = coarse_monotonic_usec();
  for (EntrySlot slot = 0; slot < table_.slot_count(); ++slot) {
    const Entry& e = table_.entry(slot);
    if (!e.in_use || e.dead || !table_.host_readable(e) || e.on_disk) continue;
    if (!TieringPolicy::flush_takes(e, everything, now)) continue;
    flush_queue_.push_back(slot);
    ++flush_.entries_total;
    flush_.bytes_total += e.extent_bytes;
  }
  ret_job_id = flush_.job_id;
  advance_flush();
  return Status::Ok;
}

void DiskMover::advance_flush() {
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

}  // namespace kvpark::daemon
