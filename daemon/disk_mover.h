// The disk plumbing: moves entries between the host arena and the disk tier. It runs
// spill and promotion jobs through the DiskTier and settles their completions, keeps
// the chain order of spills (the durability invariant, docs/disk.md), demotes at low
// water, keeps the disk within its capacity, runs flushes, and indexes what the disk
// tier recovered at start (disk_recovery.cpp). What to spill, demote or promote is
// the tiering policy's (tiering_policy.h); Park calls in from its verbs.
//
// A spill pins its entry (no eviction, no reuse of the extent) until it is settled;
// a block written before its predecessor is durable waits, pinned, until that one
// is (or is dropped if that one fails). Without a disk tier everything is a no-op.
// Loop thread only.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/control.h"
#include "daemon/counters.h"
#include "daemon/entry_table.h"
#include "daemon/tiering_policy.h"
#include "proto/status.h"

namespace kvpark::disk {
struct DiskCompletion;
struct RecoveryReport;
struct RecordInfo;
}  // namespace kvpark::disk

namespace kvpark::daemon {

class DiskTier;
// Progress of a flush (operator command or planned shutdown): control.h's view of it.
using FlushState = FlushProgress;

struct DiskMoverOptions {
  uint8_t* arena_data = nullptr;  // the daemon's mapping of the data region
  uint64_t incarnation = 0;       // stamped into promoted images' entry headers
  DiskTier* disk = nullptr;       // null: host tier only
};

class DiskMover {
 public:
  DiskMover(const DiskMoverOptions& options, EntryTable& table, Counters& counters)
      : arena_data_(options.arena_data),
        incarnation_(options.incarnation),
        disk_(options.disk),
        table_(table),
        counters_(counters) {}

  DiskTier* disk() const { return disk_; }
  TieringPolicy& policy() { return policy_; }
  const TieringPolicy& policy() const { return policy_; }

  // Spills `slot` and first whatever of its chain lacks a disk copy; false when the
  // chain cannot become whole (a predecessor is gone or unreadable) or nothing started.
  bool spill_chain(EntrySlot slot, uint64_t flush_job);
  // Starts reading a disk-only entry into a new extent; false: not placed on the host.
  bool start_promotion(EntrySlot slot);
  // Deletes the entry's record; an entry left on no tier is erased.
  void remove_from_disk(EntrySlot slot);
  // Demotes or evicts from the cold end until the low-water mark holds (policy).
  void keep_low_water();
  // Takes the disk tier's completions and settles them; true when a promotion
  // finished (WAITs on it may be answered).
  bool take_completions();
  // Deletes records from the cold end of the disk list (chain tips first) until the
  // tier fits its capacity. Run after each batch of completions and on each tick: a
  // capacity lowered at run time, or a tip that was leased, is enforced without
  // waiting for the next spill.
  void enforce_disk_capacity();
  // Writes host-only entries to disk: all of them (operator flush) or only those
  // worth keeping (planned shutdown). BadState without a disk tier.
  Status start_flush(bool everything, uint64_t& ret_job_id);
  // Starts the flush's next spills, as many as spills_in_flight_max allows.
  void advance_flush();
  const FlushState& flush_state() const { return flush_; }
  bool idle() const { return jobs_.empty(); }
  size_t spills_waiting_for_predecessor() const { return waiting_spills_.size(); }
  // Indexes the records the disk tier found at start; returns how many it skipped.
  uint64_t recover(const disk::RecoveryReport& report);

 private:
  struct DiskJob {
    bool spill = true;
    uint64_t start_usec = 0;  // CLOCK_MONOTONIC
    EntrySlot slot = no_slot;
    uint64_t entry_id = 0;  // slot + generation, to notice a reused slot (a bug)
    uint64_t flush_job = 0;
  };
  struct WaitingSpill {
    DiskJob job;
    uint64_t bytes = 0;  // record file bytes
  };

  // The durability invariant: a block's record is written only once its predecessor
  // is durable or being written, and reported durable (on_disk) only once its
  // predecessor is. chain_parent: the predecessor's slot; no_slot for a chain's
  // first block, a snapshot, or a predecessor that is gone (then *ret_gone is set).
  EntrySlot chain_parent(const Entry& e, bool* ret_gone) const;
  bool spilling(EntrySlot slot) const { return spilling_.contains(slot); }
  // A flush's spills (and their predecessors') are exempt from the write budget.
  bool start_spill(EntrySlot slot, uint64_t flush_job, bool budget_exempt);
  // A spill that completed (or failed): attach, account, demote.
  void finish_spill(const DiskJob& job, Status status, uint64_t bytes, int err);
  // A promotion that completed (or failed): check and stamp the image, or drop the entry.
  void finish_promotion(const DiskJob& job, const disk::DiskCompletion& done);
  // Whether a promoted image's entry header names the entry; if so, stamps it with
  // this incarnation.
  bool stamp_promoted_image(const Entry& e);
  // Settles spills that completed before their predecessor did.
  void settle_waiting_spills();
  // Recovery: the records a lookup can reach, in chain order; the rest in ret_unreachable.
  static std::vector<const disk::RecordInfo*> reachable_records(
      const disk::RecoveryReport& report, std::vector<const disk::RecordInfo*>& ret_unreachable);

  uint8_t* arena_data_;
  uint64_t incarnation_;
  DiskTier* disk_;
  EntryTable& table_;
  Counters& counters_;
  TieringPolicy policy_;
  std::unordered_map<uint64_t, DiskJob> jobs_;  // by disk job id
  // Slots with a spill in flight, or written and waiting for their predecessor.
  std::unordered_set<EntrySlot> spilling_;
  std::vector<WaitingSpill> waiting_spills_;
  size_t spills_in_flight_ = 0;
  std::vector<EntrySlot> flush_queue_;  // slots still to spill for the flush
  FlushState flush_{.done = true};
  uint64_t next_flush_id_ = 1;
};

}  // namespace kvpark::daemon
