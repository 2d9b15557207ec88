// The operator's view of the daemon: queries and commands for the D-Bus and HTTP
// adapters and for kvparkctl.
//
// Adapters run on their own threads; every method here may be called from any
// thread. Each call is carried out on the event loop (LoopQueue) so the core
// stays single-threaded, and returns plain values: the adapters translate them to
// D-Bus, JSON or Prometheus text, and know nothing of the core's internals.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "daemon/latency_histogram.h"
#include "proto/status.h"
#include "proto/types.h"

namespace kvpark::daemon {

struct StatusInfo {
  std::string version;
  uint64_t incarnation = 0;
  uint64_t uptime_usec = 0;
  std::string socket_path;
  // Host arena.
  uint64_t arena_data_bytes = 0;
  uint64_t arena_used_bytes = 0;
  uint64_t arena_free_bytes = 0;
  uint64_t arena_largest_free_bytes = 0;
  uint64_t arena_low_water_bytes = 0;
  uint64_t reservation_bytes_max = 0;
  std::string arena_pages;       // what backs the arena: "hugetlb", "thp" or "4k"
  uint64_t arena_page_bytes = 0;
  // Disk tier (zero / false when it is off).
  bool disk_enabled = false;
  bool disk_read_only = false;  // records are served, nothing is written
  std::string disk_directory;
  uint64_t disk_bytes = 0;
  uint64_t disk_capacity_bytes = 0;
  uint64_t disk_write_budget_bytes_per_day = 0;
  uint64_t disk_written_today_bytes = 0;
  // Population.
  uint64_t entries = 0;
  uint64_t blocks = 0;
  uint64_t snapshots = 0;
  uint64_t pinned = 0;
  uint64_t namespaces = 0;
  uint64_t namespaces_reused = 0;  // indexes a new namespace took from an empty one
  uint64_t connections = 0;
  uint64_t leases = 0;
  uint64_t reservations = 0;
  // Counters since start.
  uint64_t lookups = 0;
  uint64_t lookup_hit_tokens = 0;  // found restorable by lookups
  uint64_t restored_tokens = 0;    // restored, as clients reported at release
  uint64_t reuse_root = 0;
  uint64_t reuse_shared_stable_prefix = 0;
  uint64_t reuse_private_turn_closure = 0;
  uint64_t evictions = 0;
  // By cause: making room for a new extent (a reservation or a promotion; and the
  // bytes those freed), or keeping the arena above its low-water mark.
  uint64_t evictions_for_room = 0;
  uint64_t evictions_for_room_bytes = 0;
  uint64_t evictions_for_low_water = 0;
  uint64_t dedup_hits = 0;
  uint64_t protocol_errors = 0;
  uint64_t handshake_timeouts = 0;  // connections closed for no HELLO in time
  // Idle connections of a process over its share closed to admit another process of
  // the same uid at its cap (fair share, server.h).
  uint64_t connections_displaced = 0;
  // Reservations refused for a connection's or uid's unsealed quota, and those aborted
  // for staying unsealed past limits::unsealed_deadline_usec; the quotas.
  uint64_t unsealed_quota_refusals = 0;
  uint64_t reservations_expired = 0;
  uint64_t unsealed_connection_bytes_max = 0;
  uint64_t unsealed_uid_bytes_max = 0;
  uint64_t seal_corrupt = 0;
  uint64_t spills = 0;
  uint64_t spill_bytes = 0;
  uint64_t restores = 0;       // disk -> host promotions
  uint64_t restore_bytes = 0;
  uint64_t checksum_failures = 0;
  uint64_t corrupt_payloads = 0;  // host payloads engines found altered, dropped
  uint64_t corrupt_reports_refuted = 0;  // reports of payloads that were intact: kept
  uint64_t disk_io_errors = 0;
  uint64_t spill_failures = 0;  // all causes; by cause below (SpillFailure, counters.h)
  uint64_t spill_failures_no_space = 0;
  uint64_t spill_failures_io_error = 0;
  uint64_t spill_failures_read_only = 0;
  uint64_t spill_failures_damaged_header = 0;
  // The host tier's start (docs/operations.md, "Restarts"): adopted from the
  // previous instance through the service manager's fd store, or made new.
  bool arena_adopted = false;
  bool adoption_hold = false;      // adopted extents not reused yet (the previous instance's leases)
  std::string adoption;            // "adopted N entries (X GiB) from the previous instance in T ms; ..."
  std::string fresh_start_reason;  // why kept fds were not adopted; empty otherwise
  uint64_t adopted_entries = 0;
  uint64_t adopted_bytes = 0;
  uint64_t adoption_usec = 0;
  uint64_t adopted_reservations = 0;  // extents reserved when it stopped, held like adopted entries
  uint64_t adopted_reservation_bytes = 0;
  bool adoption_index_kept = false;  // the index a clean stop left was adopted, not rebuilt
  uint64_t adoption_dropped = 0;   // records dropped at adoption, all reasons
  uint64_t adoption_dropped_damaged = 0;    // failed their record checksum
  uint64_t adoption_dropped_namespace = 0;  // their namespace record was missing or damaged
  uint64_t adoption_dropped_extent = 0;     // outside the arena, overlapping, or a duplicate
  uint64_t adoption_dropped_header = 0;     // a snapshot's entry header named another entry
  uint64_t adoption_dropped_tail = 0;       // a snapshot's tail tokens were altered
  DiskLatencyHistogram spill_latency;    // one entry, host -> disk, until durable
  DiskLatencyHistogram restore_latency;  // one entry, disk -> host, verified
  // Remote tier (zero / false when it is off; docs/remote.md).
  bool remote_enabled = false;
  bool remote_up = false;          // the last job reached the store
  bool remote_cluster = false;     // Redis Cluster (else one Redis)
  std::string remote_seeds;
  std::string remote_write;        // shared | all | off
  uint64_t remote_nodes_known = 0;
  uint64_t remote_nodes_up = 0;
  uint64_t remote_hits = 0;        // entries restored from the store, verified
  uint64_t remote_hit_bytes = 0;
  uint64_t remote_probes = 0;      // existence checks (one per lookup that asked)
  uint64_t remote_probe_keys = 0;
  uint64_t remote_writes = 0;      // entries written behind
  uint64_t remote_writes_present = 0;  // already in the store
  uint64_t remote_writes_failed = 0;
  uint64_t remote_writes_dropped = 0;  // the write-behind queue was full
  uint64_t remote_writes_pending = 0;  // accepted, not finished yet (queued or being written)
  uint64_t remote_writes_refused = 0;  // values the store refused (e.g. OOM)
  uint64_t remote_bytes_in = 0;
  uint64_t remote_bytes_out = 0;
  uint64_t remote_errors = 0;      // jobs that could not reach the store
  uint64_t remote_corrupt = 0;     // values that failed a check: missed and deleted
  uint64_t remote_rejected = 0;    // fetched entries the daemon's own checks refused
  uint64_t remote_redirects = 0;   // MOVED / ASK followed
  uint64_t remote_read_bytes_per_second = 0;  // measured by restores; 0: not yet
  uint64_t remote_read_latency_usec = 0;      // per restore, measured by small ones; 0: not yet
  // The worker's time on each job (daemon/latency_histogram.h), whatever its outcome.
  RemoteLatencyHistogram remote_probe_latency;  // one existence check of a lookup's chain
  RemoteLatencyHistogram remote_get_latency;    // one entry streamed from the store into the arena
  RemoteLatencyHistogram remote_write_latency;  // one write-behind (written, present or failed)
  RemoteLatencyHistogram remote_queue_latency;  // any job: submitted until the worker took it
};

struct NamespaceSummary {
  NamespaceId id;
  Geometry geometry;
  uint32_t chain_tokens = 0;
  uint32_t prefill_tokens_per_second = 0;
  uint64_t blocks = 0;
  uint64_t snapshots = 0;
  uint64_t host_bytes = 0;
  uint64_t disk_bytes = 0;
  uint64_t restorable_tokens = 0;  // found restorable by lookups, since start
  uint64_t restored_tokens = 0;    // restored, as clients reported, since start
};

struct EntrySummary {
  uint64_t id = 0;  // stable while the entry lives; not reused soon after
  NamespaceId namespace_id;
  EntryKind kind = EntryKind::Block;
  Tier tier = Tier::Host;
  Hash128 key_hash;
  uint32_t position = 0;  // tokens restored through this entry
  uint32_t tail_tokens = 0;
  uint64_t bytes = 0;     // extent bytes (host) or record bytes (disk-only)
  EntryClass entry_class = EntryClass::Private;
  Evidence evidence = Evidence::DefaultAutomatic;
  uint64_t hits = 0;
  uint64_t idle_usec = 0;  // since last use
  uint64_t creator_session = 0;
  uint32_t leases = 0;
  bool pinned = false;
};

struct EntryFilter {
  std::optional<NamespaceId> namespace_id;
  std::optional<Tier> tier;  // Host matches Host and Both; Disk matches Disk and Both
  std::optional<EntryClass> entry_class;
  uint64_t offset = 0;       // paging, in filtered order (most recently used first)
  uint64_t limit = 100;
};

// GET /health: "ready" (200) when the daemon serves engines with every tier it was
// configured with; otherwise 503 with the state and why (docs/operations.md).
struct HealthInfo {
  bool ready = false;
  std::string state;                 // "ready", "degraded", "starting", "stopping", "stuck"
  std::vector<std::string> reasons;  // empty when ready
};

struct FlushProgress {
  uint64_t job_id = 0;
  bool done = false;
  Status status = Status::Ok;
  uint64_t entries_total = 0;
  uint64_t entries_done = 0;
  uint64_t bytes_total = 0;
  uint64_t bytes_done = 0;
};

// Limits settable at run time, by name (kvparkctl set-limit NAME VALUE).
inline constexpr const char* limit_arena_low_water = "arena-low-water";
inline constexpr const char* limit_reservation_max = "reservation-max";
inline constexpr const char* limit_disk_capacity = "disk-capacity";
inline constexpr const char* limit_disk_write_budget = "disk-write-budget";

// A set-limit that took effect.
struct LimitChange {
  std::string name;  // as set-limit names it ("arena-low-water")
  uint64_t old_value = 0;
  uint64_t new_value = 0;
  std::string caller;
};

class Control {
 public:
  virtual ~Control() = default;

  virtual StatusInfo status() = 0;
  virtual HealthInfo health() = 0;
  virtual std::vector<NamespaceSummary> namespaces() = 0;
  // A page of entries matching `filter`; ret_total is the count before paging.
  virtual std::vector<EntrySummary> entries(const EntryFilter& filter, uint64_t& ret_total) = 0;
  virtual Status entry(uint64_t id, EntrySummary& ret_entry) = 0;

  // Commands (the adapters check the caller's privilege first). A refusal's
  // ret_message names its cause for the operator (the allowed range, the pin).
  virtual Status pin(uint64_t id, bool pinned) = 0;
  // From every tier; BadState if pinned, leased or being written.
  virtual Status evict(uint64_t id, std::string& ret_message) = 0;
  virtual Status drop_namespace(const NamespaceId& id, uint64_t& ret_dropped) = 0;
  // `caller` says who asked ("root (uid 0, pid 4242) over D-Bus"), for the log.
  // Ranges: daemon/runtime_limits.h.
  virtual Status set_limit(const std::string& name, uint64_t value, const std::string& caller,
                           std::string& ret_message) = 0;
  // Starts writing every host-only entry worth keeping to disk; progress by job id.
  virtual Status start_flush(uint64_t& ret_job_id) = 0;
  virtual Status flush_progress(uint64_t job_id, FlushProgress& ret_progress) = 0;
  virtual Status reload_config(std::string& ret_message) = 0;
};

}  // namespace kvpark::daemon
