// What the daemon core counts since start (STATS, the HTTP and D-Bus status):
// the verbs' counters and the disk plumbing's.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

#include "daemon/control.h"
#include "proto/types.h"

namespace kvpark::daemon {

// Why a spill failed, for operators: a full file system, a device error, a file system
// mounted read-only under the daemon, or an arena header the daemon no longer trusts.
enum class SpillFailure { no_space, io_error, read_only, damaged_header, count };

inline const char* spill_failure_name(SpillFailure cause) {
  switch (cause) {
    case SpillFailure::no_space: return "no_space";
    case SpillFailure::io_error: return "io_error";
    case SpillFailure::read_only: return "read_only";
    case SpillFailure::damaged_header: return "damaged_header";
    case SpillFailure::count: break;
  }
  return "?";
}

// The cause of a spill that failed with errno `err`.
inline SpillFailure spill_failure_of_errno(int err) {
  if (err == ENOSPC || err == EDQUOT) return SpillFailure::no_space;
  if (err == EROFS) return SpillFailure::read_only;
  return SpillFailure::io_error;
}

struct Counters {
  uint64_t lookups = 0;
  uint64_t lookup_hit_tokens = 0;  // found restorable by lookups, once settled
  uint64_t restored_tokens = 0;    // restored, as clients report at release
  uint64_t dedup_hits = 0;
  uint64_t protocol_errors = 0;
  uint64_t handshake_timeouts = 0;
  uint64_t connections_displaced = 0;  // closed, idle, to admit another process of the uid
  uint64_t unsealed_quota_refusals = 0;  // reservations past a connection's or uid's quota
  uint64_t reservations_expired = 0;     // aborted, unsealed past limits::unsealed_deadline_usec
  uint64_t seal_corrupt = 0;
  uint64_t reuse[reuse_kind_max + 1] = {};
  uint64_t spills = 0;           // completed
  uint64_t spill_bytes = 0;
  uint64_t spill_failures = 0;  // all causes
  uint64_t spill_failures_by_cause[size_t(SpillFailure::count)] = {};
  void count_spill_failure(SpillFailure cause) {
    ++spill_failures;
    ++spill_failures_by_cause[size_t(cause)];
  }
  uint64_t promotions = 0;       // completed disk -> host restores
  uint64_t promotion_bytes = 0;
  uint64_t promotion_failures = 0;
  uint64_t checksum_failures = 0;
  uint64_t corrupt_payloads = 0;  // host payloads engines found altered (REPORT_CORRUPT)
  uint64_t corrupt_reports_refuted = 0;      // REPORT_CORRUPTs whose payload checked out intact
  uint64_t unreachable_records_removed = 0;  // at recovery: their chain did not reach them
  uint64_t chain_spills_dropped = 0;  // written, but the predecessor's spill failed
  uint64_t budget_refusals = 0;  // spills skipped: daily write budget spent
  uint64_t recompute_instead = 0;  // disk entries not promoted: recomputing is faster
  DiskLatencyHistogram spill_latency;
  DiskLatencyHistogram promotion_latency;
  uint64_t remote_promotions = 0;  // remote -> host, verified and sealed
  uint64_t remote_promotion_bytes = 0;
  uint64_t remote_rejected = 0;    // fetched but failed the daemon's checks (chain hash, header)
};

}  // namespace kvpark::daemon
