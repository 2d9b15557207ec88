// Tiering policy: which entries go to disk and when, and which come back. Decisions
// only, no I/O: the disk plumbing (disk_mover.h) asks here, then moves bytes
// through the DiskTier.
//
//  - Write-through: shared entries and explicit breakpoints are spilled at SEAL (and
//    when a parked entry is presented again as either).
//  - Low water: while the arena's free bytes are under low_water_bytes(), the
//    coldest host entries are demoted (spilled, the host copy dropped once the write
//    is durable) when the disk can take them and they are worth keeping
//    (value_model.h), and evicted otherwise; at most spills_in_flight_max at once.
//  - Flush: an operator flush takes every host-only entry, the planned-shutdown
//    flush those worth keeping.
//  - Load versus recompute: a LOOKUP promotes a disk-only entry only when reading it
//    is expected to be faster than recomputing its tokens at the engine's rate, with
//    the read bandwidth measured from the daemon's own promotions (bytes over each
//    busy period, smoothed).
#pragma once

#include <cstddef>
#include <cstdint>

#include "daemon/entry_table.h"

namespace kvpark::daemon {

// The daemon's own pacing of background and flush spills.
inline constexpr size_t spills_in_flight_max = 16;
// A busy period of promotions moving fewer bytes says more about latency than
// bandwidth: no sample.
inline constexpr uint64_t bandwidth_sample_bytes_min = 1ull << 20;

class TieringPolicy {
 public:
  static bool write_through(const Entry& e) {
    return e.entry_class == EntryClass::Shared || e.evidence == Evidence::ExplicitBreakpoint;
  }
  // At low water: demote (true) rather than evict this host entry, when the disk
  // is writable and the entry has no disk copy yet.
  static bool demotes(const Entry& e, bool disk_writable, uint64_t now_usec);
  // Whether a flush (everything: the operator's; else the planned shutdown's) takes
  // this host-only entry.
  static bool flush_takes(const Entry& e, bool everything, uint64_t now_usec);

  void set_low_water_bytes(uint64_t bytes) { low_water_bytes_ = bytes; }
  uint64_t low_water_bytes() const { return low_water_bytes_; }
  bool below_low_water(uint64_t bytes_free) const { return bytes_free < low_water_bytes_; }

  // Whether reading a disk-only entry beats recomputing it (true until measured).
  bool load_beats_recompute(const Entry& e, const NamespaceInfo& ns) const;
  // Bandwidth measurement: a promotion started; one completed, whatever its outcome
  // (the last of a busy period takes the sample, its own extent included); the
  // bytes of a good one, counted toward the next sample of its busy period.
  void promotion_started();
  void promotion_completed(uint64_t extent_bytes);
  void promotion_delivered(uint64_t bytes) { promotion_busy_bytes_ += bytes; }
  double disk_read_bytes_per_second() const { return disk_read_bytes_per_second_; }

 private:
  uint64_t low_water_bytes_ = 0;
  double disk_read_bytes_per_second_ = 0;  // EWMA over busy periods; 0: not measured
  size_t promotions_in_flight_ = 0;
  uint64_t promotion_busy_since_usec_ = 0;  // CLOCK_MONOTONIC
  uint64_t promotion_busy_bytes_ = 0;
};

}  // namespace kvpark::daemon
