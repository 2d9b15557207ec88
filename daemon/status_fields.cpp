#include "daemon/status_fields.h"

#include <iterator>

#include "proto/json_schema.h"

namespace kvpark::daemon {
namespace {

using S = StatusInfo;
using U = StatusUnit;

constexpr const char* counter = "counter";

constexpr const char* evictions_by_cause_help =
    "Host evictions by cause: room (a new extent needed it; a large one takes the cheapest "
    "contiguous stretch), low_water (keeping the arena above its mark).";
constexpr const char* spill_failures_help =
    "Spills that failed (the entry stays in memory), by cause: no_space (the file system is "
    "full), io_error, read_only (mounted read-only under the daemon), damaged_header (the "
    "entry's arena header failed its check).";
constexpr const char* adoption_dropped_help =
    "Records dropped at adoption, by reason (never served).";

// Wire names and /metrics names are what operators and tests read: never renamed.
// (version and arena_pages reach /metrics as labels: kvpark_build_info,
// kvpark_arena_page_bytes, written in http_adapter.cpp.)
const StatusField fields[] = {
    {"version", &S::version, U::text, {}, false, "Version"},
    {json_schema::incarnation, &S::incarnation, U::id},
    {"uptime_usec", &S::uptime_usec, U::usec,
     {"kvpark_uptime_seconds", "gauge", "Seconds since kvparkd started.", "", true}},
    {"socket_path", &S::socket_path, U::text},
    // Host arena.
    {"arena_pages", &S::arena_pages, U::text},
    {"arena_page_bytes", &S::arena_page_bytes, U::bytes},
    {"arena_data_bytes", &S::arena_data_bytes, U::bytes,
     {"kvpark_tier_capacity_bytes", "gauge", "Bytes each tier may hold (0: tier off).",
      "tier=\"host\""},
     false, "ArenaBytes"},
    {"arena_used_bytes", &S::arena_used_bytes, U::bytes,
     {"kvpark_tier_used_bytes", "gauge", "Bytes held, per tier.", "tier=\"host\""}},
    {"arena_free_bytes", &S::arena_free_bytes, U::bytes,
     {"kvpark_arena_free_bytes", "gauge", "Free bytes in the host arena."}, false,
     "ArenaFreeBytes"},
    {"arena_largest_free_bytes", &S::arena_largest_free_bytes, U::bytes,
     {"kvpark_arena_largest_free_bytes", "gauge", "Largest free run in the host arena."}},
    {"arena_low_water_bytes", &S::arena_low_water_bytes, U::bytes,
     {"kvpark_arena_low_water_bytes", "gauge",
      "Free bytes the daemon keeps in the arena by evicting."},
     false, "ArenaLowWaterBytes"},
    {"reservation_bytes_max", &S::reservation_bytes_max, U::bytes,
     {"kvpark_reservation_max_bytes", "gauge", "Largest single reservation."}},
    // Disk tier.
    {"disk_enabled", &S::disk_enabled, U::flag},
    {"disk_read_only", &S::disk_read_only, U::flag,
     {"kvpark_disk_read_only", "gauge", "1 when the disk tier is served read-only."}},
    {"disk_directory", &S::disk_directory, U::text},
    {"disk_bytes", &S::disk_bytes, U::bytes,
     {"kvpark_tier_used_bytes", "gauge", "", "tier=\"disk\""}},
    {"disk_capacity_bytes", &S::disk_capacity_bytes, U::bytes,
     {"kvpark_tier_capacity_bytes", "gauge", "", "tier=\"disk\""}},
    {"disk_write_budget_bytes_per_day", &S::disk_write_budget_bytes_per_day, U::bytes,
     {"kvpark_disk_write_budget_bytes", "gauge", "Bytes the disk tier may write per day."}},
    {"disk_written_today_bytes", &S::disk_written_today_bytes, U::bytes,
     {"kvpark_disk_written_today_bytes", "gauge", "Bytes the disk tier wrote today."}},
    // Population.
    {"entries", &S::entries, U::count, {}, false, "Entries"},
    {"blocks", &S::blocks, U::count,
     {"kvpark_entries", "gauge", "Sealed entries, by kind.", "kind=\"block\""}},
    {"snapshots", &S::snapshots, U::count, {"kvpark_entries", "gauge", "", "kind=\"snapshot\""}},
    {"pinned", &S::pinned, U::count, {"kvpark_pinned_entries", "gauge", "Pinned entries."}, false,
     "Pinned"},
    {"namespaces", &S::namespaces, U::count, {"kvpark_namespaces", "gauge", "Namespaces known."},
     false, "Namespaces"},
    {"namespaces_reused", &S::namespaces_reused, U::count,
     {"kvpark_namespaces_reused_total", counter,
      "Namespace indexes a new namespace took from one that held nothing (the table was full)."}},
    {"connections", &S::connections, U::count,
     {"kvpark_connections", "gauge", "Engine connections open."}, false, "Connections"},
    {"leases", &S::leases, U::count, {"kvpark_leases", "gauge", "Plan leases open."}, false,
     "Leases"},
    {"reservations", &S::reservations, U::count,
     {"kvpark_reservations", "gauge", "Reservations open."}},
    // Lookups.
    {"lookups", &S::lookups, U::count, {"kvpark_lookups_total", counter, "Lookups answered."}},
    {"reuse_root", &S::reuse_root, U::count,
     {"kvpark_lookup_reuse_total", counter, "Lookups by reuse kind of their plan.",
      "kind=\"root\""}},
    {"reuse_shared_stable_prefix", &S::reuse_shared_stable_prefix, U::count,
     {"kvpark_lookup_reuse_total", counter, "", "kind=\"shared_stable_prefix\""}},
    {"reuse_private_turn_closure", &S::reuse_private_turn_closure, U::count,
     {"kvpark_lookup_reuse_total", counter, "", "kind=\"private_turn_closure\""}},
    {"lookup_hit_tokens", &S::lookup_hit_tokens, U::count,
     {"kvpark_lookup_hit_tokens_total", counter,
      "Tokens lookups found restorable (a client that looks up twice counts twice)."}},
    {"restored_tokens", &S::restored_tokens, U::count,
     {"kvpark_restored_tokens_total", counter,
      "Tokens clients restored from parked state, as they reported at release (prefill "
      "saved)."}},
    // Evictions and the engines' conduct.
    {"evictions", &S::evictions, U::count,
     {"kvpark_evictions_total", counter, "Entries evicted from the host arena."}},
    {"evictions_for_room", &S::evictions_for_room, U::count,
     {"kvpark_evictions_by_cause_total", counter, evictions_by_cause_help, "cause=\"room\""}},
    {"evictions_for_low_water", &S::evictions_for_low_water, U::count,
     {"kvpark_evictions_by_cause_total", counter, "", "cause=\"low_water\""}},
    {"evictions_for_room_bytes", &S::evictions_for_room_bytes, U::bytes,
     {"kvpark_eviction_room_bytes_total", counter,
      "Bytes the evictions for room freed (at most each extent's size plus one entry)."}},
    {"dedup_hits", &S::dedup_hits, U::count,
     {"kvpark_dedup_hits_total", counter, "Reservations answered 'already parked'."}},
    {"protocol_errors", &S::protocol_errors, U::count,
     {"kvpark_protocol_errors_total", counter, "Malformed frames (connection closed)."}},
    {"handshake_timeouts", &S::handshake_timeouts, U::count,
     {"kvpark_handshake_timeouts_total", counter,
      "Engine connections closed for sending no HELLO in time."}},
    {"unsealed_quota_refusals", &S::unsealed_quota_refusals, U::count,
     {"kvpark_unsealed_quota_refusals_total", counter,
      "Reservations refused (LIMIT_EXCEEDED) for a connection's or a uid's quota of reserved, "
      "unsealed bytes."}},
    {"reservations_expired", &S::reservations_expired, U::count,
     {"kvpark_reservations_expired_total", counter,
      "Reservations left unsealed past the deadline: aborted, their space given back."}},
    {"connections_displaced", &S::connections_displaced, U::count,
     {"kvpark_connections_displaced_total", counter,
      "Idle connections of a process over its share closed to admit another process of the "
      "same uid at its connection cap."}},
    {"unsealed_connection_bytes_max", &S::unsealed_connection_bytes_max, U::bytes},
    {"unsealed_uid_bytes_max", &S::unsealed_uid_bytes_max, U::bytes},
    {"seal_corrupt", &S::seal_corrupt, U::count,
     {"kvpark_seal_corrupt_total", counter, "Seals refused for a damaged entry header."}},
    // Disk traffic.
    {"spills", &S::spills, U::count,
     {"kvpark_spills_total", counter, "Entries written to the disk tier."}},
    {"spill_bytes", &S::spill_bytes, U::bytes,
     {"kvpark_spill_bytes_total", counter, "Bytes written to the disk tier."}},
    {"restores", &S::restores, U::count,
     {"kvpark_restores_total", counter, "Entries promoted from disk to host."}},
    {"restore_bytes", &S::restore_bytes, U::bytes,
     {"kvpark_restore_bytes_total", counter, "Bytes promoted from disk to host."}},
    {"checksum_failures", &S::checksum_failures, U::count,
     {"kvpark_checksum_failures_total", counter, "Disk records whose checksum failed."}},
    {"corrupt_payloads", &S::corrupt_payloads, U::count,
     {"kvpark_corrupt_payloads_total", counter,
      "Host payloads engines found altered at restore (dropped, never served)."}},
    {"corrupt_reports_refuted", &S::corrupt_reports_refuted, U::count,
     {"kvpark_corrupt_reports_refuted_total", counter,
      "Engine reports of an altered payload that the daemon found intact (entry kept)."}},
    {"disk_io_errors", &S::disk_io_errors, U::count,
     {"kvpark_disk_io_errors_total", counter, "Disk tier I/O errors."}},
    {"spill_failures", &S::spill_failures, U::count},
    {"spill_failures_no_space", &S::spill_failures_no_space, U::count,
     {"kvpark_spill_failures_total", counter, spill_failures_help, "cause=\"no_space\""}},
    {"spill_failures_io_error", &S::spill_failures_io_error, U::count,
     {"kvpark_spill_failures_total", counter, "", "cause=\"io_error\""}},
    {"spill_failures_read_only", &S::spill_failures_read_only, U::count,
     {"kvpark_spill_failures_total", counter, "", "cause=\"read_only\""}},
    {"spill_failures_damaged_header", &S::spill_failures_damaged_header, U::count,
     {"kvpark_spill_failures_total", counter, "", "cause=\"damaged_header\""}},
    // Restart.
    {"arena_adopted", &S::arena_adopted, U::flag,
     {"kvpark_arena_adopted", "gauge",
      "1 when this instance adopted the previous instance's arena (the service manager kept "
      "it)."}},
    {"adoption_hold", &S::adoption_hold, U::flag,
     {"kvpark_adoption_hold", "gauge",
      "1 while adopted extents wait for the previous instance's engines before reuse."}},
    {"adoption", &S::adoption, U::text},
    {"fresh_start_reason", &S::fresh_start_reason, U::text},
    {"adopted_entries", &S::adopted_entries, U::count,
     {"kvpark_adopted_entries", "gauge", "Entries adopted from the previous instance at start."}},
    {"adopted_bytes", &S::adopted_bytes, U::bytes,
     {"kvpark_adopted_bytes", "gauge", "Arena bytes adopted from the previous instance at start."}},
    {"adoption_usec", &S::adoption_usec, U::usec,
     {"kvpark_adoption_seconds", "gauge", "Time adoption took at start (records read, index rebuilt).",
      "", true}},
    {"adopted_reservations", &S::adopted_reservations, U::count,
     {"kvpark_adopted_reservations", "gauge",
      "Extents the previous instance had reserved when it stopped, held until its engines are "
      "gone."}},
    {"adopted_reservation_bytes", &S::adopted_reservation_bytes, U::bytes},
    {"adoption_index_kept", &S::adoption_index_kept, U::flag,
     {"kvpark_adoption_index_kept", "gauge",
      "1 when adoption took the index a clean stop left instead of rebuilding it."}},
    {"adoption_dropped", &S::adoption_dropped, U::count},
    {"adoption_dropped_damaged", &S::adoption_dropped_damaged, U::count,
     {"kvpark_adoption_dropped", "gauge", adoption_dropped_help, "reason=\"damaged\""}},
    {"adoption_dropped_namespace", &S::adoption_dropped_namespace, U::count,
     {"kvpark_adoption_dropped", "gauge", "", "reason=\"namespace\""}},
    {"adoption_dropped_extent", &S::adoption_dropped_extent, U::count,
     {"kvpark_adoption_dropped", "gauge", "", "reason=\"extent\""}},
    {"adoption_dropped_header", &S::adoption_dropped_header, U::count,
     {"kvpark_adoption_dropped", "gauge", "", "reason=\"header\""}},
    {"adoption_dropped_tail", &S::adoption_dropped_tail, U::count,
     {"kvpark_adoption_dropped", "gauge", "", "reason=\"tail\""}},
    // Remote tier (docs/remote.md).
    {"remote_enabled", &S::remote_enabled, U::flag},
    {"remote_up", &S::remote_up, U::flag,
     {"kvpark_remote_up", "gauge", "1 when the remote store answered the last job."}, true},
    {"remote_cluster", &S::remote_cluster, U::flag},
    {"remote_seeds", &S::remote_seeds, U::text},
    {"remote_write", &S::remote_write, U::text},
    {"remote_nodes_known", &S::remote_nodes_known, U::count,
     {"kvpark_remote_nodes_known", "gauge", "Remote store nodes the client knows."}, true},
    {"remote_nodes_up", &S::remote_nodes_up, U::count,
     {"kvpark_remote_nodes_up", "gauge", "Remote store nodes not backing off."}, true},
    {"remote_hits", &S::remote_hits, U::count,
     {"kvpark_remote_hits_total", counter, "Entries restored from the remote store, verified."},
     true},
    {"remote_hit_bytes", &S::remote_hit_bytes, U::bytes,
     {"kvpark_remote_hit_bytes_total", counter, "Arena bytes restored from the remote store."},
     true},
    {"remote_probes", &S::remote_probes, U::count,
     {"kvpark_remote_probes_total", counter, "Existence checks of lookups' missing chains."}, true},
    {"remote_probe_keys", &S::remote_probe_keys, U::count},
    {"remote_writes", &S::remote_writes, U::count,
     {"kvpark_remote_writes_total", counter, "Entries written behind to the remote store."}, true},
    {"remote_writes_present", &S::remote_writes_present, U::count},
    {"remote_writes_failed", &S::remote_writes_failed, U::count,
     {"kvpark_remote_writes_failed_total", counter,
      "Write-behinds that could not reach the store or were refused."},
     true},
    {"remote_writes_dropped", &S::remote_writes_dropped, U::count,
     {"kvpark_remote_writes_dropped_total", counter, "Write-behinds skipped: the queue was full."},
     true},
    {"remote_writes_pending", &S::remote_writes_pending, U::count,
     {"kvpark_remote_writes_pending", "gauge",
      "Write-behinds accepted and not finished yet (queued or being written)."},
     true},
    {"remote_writes_refused", &S::remote_writes_refused, U::count,
     {"kvpark_remote_writes_refused_total", counter,
      "Values the remote store refused (e.g. OOM under maxmemory)."},
     true},
    {"remote_bytes_in", &S::remote_bytes_in, U::bytes,
     {"kvpark_remote_read_bytes_total", counter, "Bytes read from the remote store."}, true},
    {"remote_bytes_out", &S::remote_bytes_out, U::bytes,
     {"kvpark_remote_written_bytes_total", counter, "Bytes written to the remote store."}, true},
    {"remote_errors", &S::remote_errors, U::count,
     {"kvpark_remote_errors_total", counter, "Remote jobs that could not reach the store."}, true},
    {"remote_corrupt", &S::remote_corrupt, U::count,
     {"kvpark_remote_corrupt_total", counter,
      "Remote values that failed a check (missed and deleted)."},
     true},
    {"remote_rejected", &S::remote_rejected, U::count,
     {"kvpark_remote_rejected_total", counter,
      "Remote entries the daemon's own checks refused (chain hash, geometry)."},
     true},
    {"remote_redirects", &S::remote_redirects, U::count,
     {"kvpark_remote_redirects_total", counter, "Redis Cluster MOVED/ASK redirections followed."},
     true},
    {"remote_read_bytes_per_second", &S::remote_read_bytes_per_second, U::bytes_per_second,
     {"kvpark_remote_read_bytes_per_second", "gauge",
      "Remote read bandwidth restores measured (a load-versus-recompute input)."},
     true},
    {"remote_read_latency_usec", &S::remote_read_latency_usec, U::usec,
     {"kvpark_remote_read_latency_seconds", "gauge",
      "Remote latency per restore, measured by small ones (a load-versus-recompute input).", "",
      true},
     true},
};

const StatusHistogram histograms[] = {
    {nullptr, &S::spill_latency, "kvpark_spill_duration_seconds",
     "Time to write one entry to the disk tier until it is durable."},
    {nullptr, &S::restore_latency, "kvpark_restore_duration_seconds",
     "Time to bring one entry back from disk into the arena, checksums verified."},
    {"remote_probe", &S::remote_probe_latency, "kvpark_remote_probe_duration_seconds",
     "The remote worker's time on one existence check of a lookup's missing chain.", true},
    {"remote_get", &S::remote_get_latency, "kvpark_remote_restore_duration_seconds",
     "The remote worker's time streaming one entry from the store into the arena (every "
     "attempt, verified or not).",
     true},
    {"remote_write", &S::remote_write_latency, "kvpark_remote_write_duration_seconds",
     "The remote worker's time on one write-behind (written, already present, or failed).", true},
    {"remote_queue", &S::remote_queue_latency, "kvpark_remote_queue_duration_seconds",
     "How long one remote job (any kind) waited for the worker before it started.", true},
};

}  // namespace

std::span<const StatusField> status_fields() {
  return fields;
}

std::span<const StatusHistogram> status_histograms() {
  return histograms;
}

uint64_t status_number(const StatusInfo& s, const StatusField& f) {
  if (auto* number = std::get_if<uint64_t StatusInfo::*>(&f.member)) return s.**number;
  if (auto* flag = std::get_if<bool StatusInfo::*>(&f.member)) return s.**flag ? 1 : 0;
  return 0;
}

std::vector<std::pair<std::string, uint64_t>> status_histogram_figures(const StatusInfo& s) {
  std::vector<std::pair<std::string, uint64_t>> figures;
  for (const StatusHistogram& h : histograms) {
    if (h.key == nullptr) continue;
    std::visit([&](auto member) { append_latency_figures(h.key, s.*member, figures); }, h.member);
  }
  return figures;
}

}  // namespace kvpark::daemon
