// HTTP routes over Control (see http_adapter.h).
#include "daemon/http_adapter.h"

#include <httplib.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>

#include "http/listener.h"
#include "http/process_metrics.h"
#include "proto/json_schema.h"
#include "proto/limits.h"
#include "proto/names.h"

namespace kvpark::daemon {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

constexpr const char* metrics_content_type = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* json_content_type = "application/json";

bool parse_count(const std::string& text, uint64_t& ret_value) {
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return false;
  ret_value = value;
  return true;
}

void json_error(httplib::Response& res, int status, const std::string& message) {
  rapidjson::StringBuffer buffer;
  JsonWriter w(buffer);
  w.StartObject();
  w.Key("error");
  w.String(message.c_str());
  w.EndObject();
  res.status = status;
  res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
}

void send_json(httplib::Response& res, const rapidjson::StringBuffer& buffer) {
  res.status = 200;
  res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
}

// Microseconds as exact decimal seconds ("0.00005", "2.5", "10"): no exponent, no rounding.
std::string seconds_text(uint64_t usec) {
  std::string text = std::to_string(usec / 1'000'000);
  if (const uint64_t fraction = usec % 1'000'000; fraction != 0) {
    char digits[8];
    snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(fraction));
    std::string f = digits;
    f.erase(f.find_last_not_of('0') + 1);
    text += "." + f;
  }
  return text;
}

// One Prometheus family: HELP and TYPE, then its samples.
class MetricsText {
 public:
  void family(const char* name, const char* type, const char* help) {
    name_ = name;
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(uint64_t value, const std::string& labels = "") {
    out_ += name_ + (labels.empty() ? "" : "{" + labels + "}") + " " + std::to_string(value) + "\n";
  }
  void sample_double(double value) {
    char text[64];
    snprintf(text, sizeof text, "%.6f", value);
    out_ += name_ + " " + text + "\n";
  }
  // A histogram family: cumulative _bucket samples (microsecond bounds shown as exact
  // decimal seconds), then _sum and _count.
  template <const auto& Bounds>
  void histogram(const char* name, const char* help, const LatencyHistogram<Bounds>& h) {
    out_ += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    for (size_t i = 0; i < h.bounded_buckets; ++i) {
      out_ += std::string(name) + "_bucket{le=\"" + seconds_text(Bounds[i]) + "\"} " +
              std::to_string(h.cumulative(i)) + "\n";
    }
    out_ += std::string(name) + "_bucket{le=\"+Inf\"} " + std::to_string(h.count) + "\n";
    out_ += std::string(name) + "_sum " + seconds_text(h.sum_usec) + "\n";
    out_ += std::string(name) + "_count " + std::to_string(h.count) + "\n";
  }
  void one(const char* name, const char* type, const char* help, uint64_t value) {
    family(name, type, help);
    sample(value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string name_;
  std::string out_;
};

std::string label(const char* key, const std::string& value) {
  return std::string(key) + "=\"" + value + "\"";  // values here never need escaping
}

void write_status(JsonWriter& w, const StatusInfo& s) {
  w.StartObject();
  w.Key("version");
  w.String(s.version.c_str());
  w.Key(json_schema::incarnation);
  w.String(hex64(s.incarnation).c_str());
  w.Key("uptime_usec");
  w.Uint64(s.uptime_usec);
  w.Key("socket_path");
  w.String(s.socket_path.c_str());
  w.Key("arena_pages");
  w.String(s.arena_pages.c_str());
  const std::pair<const char*, uint64_t> numbers[] = {
      {"arena_data_bytes", s.arena_data_bytes},
      {"arena_used_bytes", s.arena_used_bytes},
      {"arena_free_bytes", s.arena_free_bytes},
      {"arena_largest_free_bytes", s.arena_largest_free_bytes},
      {"arena_low_water_bytes", s.arena_low_water_bytes},
      {"arena_page_bytes", s.arena_page_bytes},
      {"reservation_bytes_max", s.reservation_bytes_max},
      {"disk_bytes", s.disk_bytes},
      {"disk_capacity_bytes", s.disk_capacity_bytes},
      {"disk_write_budget_bytes_per_day", s.disk_write_budget_bytes_per_day},
      {"disk_written_today_bytes", s.disk_written_today_bytes},
      {"entries", s.entries},
      {"blocks", s.blocks},
      {"snapshots", s.snapshots},
      {"pinned", s.pinned},
      {"namespaces", s.namespaces},
      {"namespaces_reused", s.namespaces_reused},
      {"connections", s.connections},
      {"leases", s.leases},
      {"reservations", s.reservations},
      {"lookups", s.lookups},
      {"lookup_hit_tokens", s.lookup_hit_tokens},
      {"restored_tokens", s.restored_tokens},
      {"reuse_root", s.reuse_root},
      {"reuse_shared_stable_prefix", s.reuse_shared_stable_prefix},
      {"reuse_private_turn_closure", s.reuse_private_turn_closure},
      {"evictions", s.evictions},
      {"evictions_for_room", s.evictions_for_room},
      {"evictions_for_room_bytes", s.evictions_for_room_bytes},
      {"evictions_for_low_water", s.evictions_for_low_water},
      {"dedup_hits", s.dedup_hits},
      {"protocol_errors", s.protocol_errors},
      {"handshake_timeouts", s.handshake_timeouts},
      {"connections_displaced", s.connections_displaced},
      {"unsealed_quota_refusals", s.unsealed_quota_refusals},
      {"reservations_expired", s.reservations_expired},
      {"unsealed_connection_bytes_max", s.unsealed_connection_bytes_max},
      {"unsealed_uid_bytes_max", s.unsealed_uid_bytes_max},
      {"seal_corrupt", s.seal_corrupt},
      {"spills", s.spills},
      {"spill_bytes", s.spill_bytes},
      {"restores", s.restores},
      {"restore_bytes", s.restore_bytes},
      {"checksum_failures", s.checksum_failures},
      {"corrupt_payloads", s.corrupt_payloads},
      {"corrupt_reports_refuted", s.corrupt_reports_refuted},
      {"disk_io_errors", s.disk_io_errors},
      {"spill_failures", s.spill_failures},
      {"spill_failures_no_space", s.spill_failures_no_space},
      {"spill_failures_io_error", s.spill_failures_io_error},
      {"spill_failures_read_only", s.spill_failures_read_only},
      {"spill_failures_damaged_header", s.spill_failures_damaged_header},
      {"adopted_entries", s.adopted_entries},
      {"adopted_bytes", s.adopted_bytes},
      {"adoption_usec", s.adoption_usec},
      {"adopted_reservations", s.adopted_reservations},
      {"adopted_reservation_bytes", s.adopted_reservation_bytes},
      {"adoption_dropped", s.adoption_dropped},
      {"adoption_dropped_damaged", s.adoption_dropped_damaged},
      {"adoption_dropped_namespace", s.adoption_dropped_namespace},
      {"adoption_dropped_extent", s.adoption_dropped_extent},
      {"adoption_dropped_header", s.adoption_dropped_header},
      {"adoption_dropped_tail", s.adoption_dropped_tail},
      {"remote_nodes_known", s.remote_nodes_known},
      {"remote_nodes_up", s.remote_nodes_up},
      {"remote_hits", s.remote_hits},
      {"remote_hit_bytes", s.remote_hit_bytes},
      {"remote_probes", s.remote_probes},
      {"remote_probe_keys", s.remote_probe_keys},
      {"remote_writes", s.remote_writes},
      {"remote_writes_present", s.remote_writes_present},
      {"remote_writes_failed", s.remote_writes_failed},
      {"remote_writes_dropped", s.remote_writes_dropped},
      {"remote_writes_pending", s.remote_writes_pending},
      {"remote_writes_refused", s.remote_writes_refused},
      {"remote_bytes_in", s.remote_bytes_in},
      {"remote_bytes_out", s.remote_bytes_out},
      {"remote_errors", s.remote_errors},
      {"remote_corrupt", s.remote_corrupt},
      {"remote_rejected", s.remote_rejected},
      {"remote_redirects", s.remote_redirects},
      {"remote_read_bytes_per_second", s.remote_read_bytes_per_second},
      {"remote_read_latency_usec", s.remote_read_latency_usec},
  };
  for (const auto& [key, value] : numbers) {
    w.Key(key);
    w.Uint64(value);
  }
  w.Key("disk_enabled");
  w.Bool(s.disk_enabled);
  w.Key("disk_read_only");
  w.Bool(s.disk_read_only);
  w.Key("disk_directory");
  w.String(s.disk_directory.c_str());
  w.Key("remote_enabled");
  w.Bool(s.remote_enabled);
  w.Key("remote_up");
  w.Bool(s.remote_up);
  w.Key("remote_cluster");
  w.Bool(s.remote_cluster);
  w.Key("remote_seeds");
  w.String(s.remote_seeds.c_str());
  w.Key("remote_write");
  w.String(s.remote_write.c_str());
  for (const auto& [key, value] : remote_latency_figures(s)) {
    w.Key(key.c_str());
    w.Uint64(value);
  }
  w.Key("arena_adopted");
  w.Bool(s.arena_adopted);
  w.Key("adoption_hold");
  w.Bool(s.adoption_hold);
  w.Key("adoption_index_kept");
  w.Bool(s.adoption_index_kept);
  w.Key("adoption");
  w.String(s.adoption.c_str());
  w.Key("fresh_start_reason");
  w.String(s.fresh_start_reason.c_str());
  w.EndObject();
}

void write_namespace(JsonWriter& w, const NamespaceSummary& n) {
  w.StartObject();
  w.Key("id");
  w.String(hex128(n.id).c_str());
  w.Key("block_tokens");
  w.Uint(n.geometry.block_tokens);
  w.Key("block_payload_bytes");
  w.Uint64(n.geometry.block_payload_bytes);
  w.Key("snapshot_required");
  w.Bool(n.geometry.snapshot_required);
  w.Key("chain_tokens");
  w.Uint(n.chain_tokens);
  w.Key("prefill_tokens_per_second");
  w.Uint(n.prefill_tokens_per_second);
  w.Key("blocks");
  w.Uint64(n.blocks);
  w.Key("snapshots");
  w.Uint64(n.snapshots);
  w.Key("host_bytes");
  w.Uint64(n.host_bytes);
  w.Key("disk_bytes");
  w.Uint64(n.disk_bytes);
  w.Key("restorable_tokens");
  w.Uint64(n.restorable_tokens);
  w.Key("restored_tokens");
  w.Uint64(n.restored_tokens);
  w.EndObject();
}

void write_entry(JsonWriter& w, const EntrySummary& e) {
  w.StartObject();
  w.Key(json_schema::entry_id);
  w.String(std::to_string(e.id).c_str());
  w.Key("namespace");
  w.String(hex128(e.namespace_id).c_str());
  w.Key("kind");
  w.String(entry_kind_name(e.kind));
  w.Key("tier");
  w.String(tier_name(e.tier));
  w.Key(json_schema::key_hash);
  w.String(hex128(e.key_hash).c_str());
  w.Key("position");
  w.Uint(e.position);
  w.Key("tail_tokens");
  w.Uint(e.tail_tokens);
  w.Key("bytes");
  w.Uint64(e.bytes);
  w.Key("class");
  w.String(entry_class_name(e.entry_class));
  w.Key("evidence");
  w.String(evidence_name(e.evidence));
  w.Key("hits");
  w.Uint64(e.hits);
  w.Key("idle_usec");
  w.Uint64(e.idle_usec);
  w.Key(json_schema::creator_session);
  w.String(std::to_string(e.creator_session).c_str());
  w.Key("leases");
  w.Uint(e.leases);
  w.Key("pinned");
  w.Bool(e.pinned);
  w.EndObject();
}

// Reads /v1/entries' query into a filter; false with the message for a 400.
bool parse_entry_filter(const httplib::Request& req, EntryFilter& ret_filter,
                        std::string& ret_error) {
  EntryFilter filter;
  filter.limit = http_entries_limit_default;
  for (const auto& [key, value] : req.params) {
    if (req.params.count(key) > 1) {
      ret_error = "query parameter '" + key + "' given more than once";
      return false;
    }
    if (key == "namespace") {
      Hash128 id;
      if (!parse_hex128(value, id)) {
        ret_error = "namespace must be up to 32 hex digits";
        return false;
      }
      filter.namespace_id = id;
    } else if (key == "tier") {
      Tier tier;
      if (!parse_tier(value, tier) || tier == Tier::Both) {
        ret_error = "tier must be host or disk";
        return false;
      }
      filter.tier = tier;
    } else if (key == "class") {
      EntryClass entry_class;
      if (!parse_entry_class(value, entry_class)) {
        ret_error = "class must be shared or private";
        return false;
      }
      filter.entry_class = entry_class;
    } else if (key == "offset") {
      if (!parse_count(value, filter.offset)) {
        ret_error = "offset must be a non-negative integer";
        return false;
      }
    } else if (key == "limit") {
      if (!parse_count(value, filter.limit) || filter.limit == 0 ||
          filter.limit > http_entries_limit_max) {
        ret_error = "limit must be an integer from 1 to " + std::to_string(http_entries_limit_max);
        return false;
      }
    } else {
      ret_error = "unknown query parameter '" + key + "'";
      return false;
    }
  }
  ret_filter = filter;
  return true;
}

}  // namespace

std::string render_metrics(const StatusInfo& s, const std::vector<NamespaceSummary>& spaces) {
  MetricsText m;
  m.family("kvpark_build_info", "gauge", "Version of the running kvparkd (always 1).");
  m.sample(1, label("version", s.version));
  m.family("kvpark_uptime_seconds", "gauge", "Seconds since kvparkd started.");
  m.sample_double(static_cast<double>(s.uptime_usec) / 1e6);

  m.family("kvpark_arena_page_bytes", "gauge", "Page size backing the host arena, by kind (hugetlb, thp, 4k).");
  m.sample(s.arena_page_bytes, label("pages", s.arena_pages));
  m.family("kvpark_tier_used_bytes", "gauge", "Bytes held, per tier.");
  m.sample(s.arena_used_bytes, label("tier", tier_name(Tier::Host)));
  m.sample(s.disk_bytes, label("tier", tier_name(Tier::Disk)));
  m.family("kvpark_tier_capacity_bytes", "gauge", "Bytes each tier may hold (0: tier off).");
  m.sample(s.arena_data_bytes, label("tier", tier_name(Tier::Host)));
  m.sample(s.disk_capacity_bytes, label("tier", tier_name(Tier::Disk)));
  m.one("kvpark_arena_free_bytes", "gauge", "Free bytes in the host arena.", s.arena_free_bytes);
  m.one("kvpark_arena_largest_free_bytes", "gauge", "Largest free run in the host arena.",
        s.arena_largest_free_bytes);
  m.one("kvpark_arena_low_water_bytes", "gauge",
        "Free bytes the daemon keeps in the arena by evicting.", s.arena_low_water_bytes);
  m.one("kvpark_reservation_max_bytes", "gauge", "Largest single reservation.",
        s.reservation_bytes_max);
  m.one("kvpark_disk_write_budget_bytes", "gauge", "Bytes the disk tier may write per day.",
        s.disk_write_budget_bytes_per_day);
  m.one("kvpark_disk_written_today_bytes", "gauge", "Bytes the disk tier wrote today.",
        s.disk_written_today_bytes);

  m.family("kvpark_entries", "gauge", "Sealed entries, by kind.");
  m.sample(s.blocks, label("kind", entry_kind_name(EntryKind::Block)));
  m.sample(s.snapshots, label("kind", entry_kind_name(EntryKind::Snapshot)));
  m.one("kvpark_pinned_entries", "gauge", "Pinned entries.", s.pinned);
  m.one("kvpark_namespaces", "gauge", "Namespaces known.", s.namespaces);
  m.one("kvpark_namespaces_reused_total", "counter",
        "Namespace indexes a new namespace took from one that held nothing (the table was full).",
        s.namespaces_reused);
  m.one("kvpark_connections", "gauge", "Engine connections open.", s.connections);
  m.one("kvpark_leases", "gauge", "Plan leases open.", s.leases);
  m.one("kvpark_reservations", "gauge", "Reservations open.", s.reservations);

  m.family("kvpark_namespace_entries", "gauge", "Sealed entries per namespace, by kind.");
  for (const NamespaceSummary& n : spaces) {
    const std::string ns = label("namespace", hex128(n.id));
    m.sample(n.blocks, ns + "," + label("kind", entry_kind_name(EntryKind::Block)));
    m.sample(n.snapshots, ns + "," + label("kind", entry_kind_name(EntryKind::Snapshot)));
  }
  m.family("kvpark_namespace_bytes", "gauge", "Bytes per namespace, by tier.");
  for (const NamespaceSummary& n : spaces) {
    const std::string ns = label("namespace", hex128(n.id));
    m.sample(n.host_bytes, ns + "," + label("tier", tier_name(Tier::Host)));
    m.sample(n.disk_bytes, ns + "," + label("tier", tier_name(Tier::Disk)));
  }
  m.family("kvpark_namespace_restorable_tokens_total", "counter",
           "Tokens lookups found restorable, per namespace.");
  for (const NamespaceSummary& n : spaces)
    m.sample(n.restorable_tokens, label("namespace", hex128(n.id)));
  m.family("kvpark_namespace_restored_tokens_total", "counter",
           "Tokens clients restored, as they reported at release, per namespace.");
  for (const NamespaceSummary& n : spaces)
    m.sample(n.restored_tokens, label("namespace", hex128(n.id)));

  m.one("kvpark_lookups_total", "counter", "Lookups answered.", s.lookups);
  m.family("kvpark_lookup_reuse_total", "counter", "Lookups by reuse kind of their plan.");
  m.sample(s.reuse_root, label("kind", reuse_kind_name(ReuseKind::Root)));
  m.sample(s.reuse_shared_stable_prefix, label("kind", reuse_kind_name(ReuseKind::SharedStablePrefix)));
  m.sample(s.reuse_private_turn_closure, label("kind", reuse_kind_name(ReuseKind::PrivateTurnClosure)));
  m.one("kvpark_lookup_hit_tokens_total", "counter",
        "Tokens lookups found restorable (a client that looks up twice counts twice).",
        s.lookup_hit_tokens);
  m.one("kvpark_restored_tokens_total", "counter",
        "Tokens clients restored from parked state, as they reported at release (prefill "
        "saved).",
        s.restored_tokens);
  m.one("kvpark_evictions_total", "counter", "Entries evicted from the host arena.", s.evictions);
  m.family("kvpark_evictions_by_cause_total", "counter",
           "Host evictions by cause: room (a new extent needed it; a large one takes the "
           "cheapest contiguous stretch), low_water (keeping the arena above its mark).");
  m.sample(s.evictions_for_room, label("cause", "room"));
  m.sample(s.evictions_for_low_water, label("cause", "low_water"));
  m.one("kvpark_eviction_room_bytes_total", "counter",
        "Bytes the evictions for room freed (at most each extent's size plus one entry).",
        s.evictions_for_room_bytes);
  m.one("kvpark_dedup_hits_total", "counter", "Reservations answered 'already parked'.",
        s.dedup_hits);
  m.one("kvpark_protocol_errors_total", "counter", "Malformed frames (connection closed).",
        s.protocol_errors);
  m.one("kvpark_handshake_timeouts_total", "counter",
        "Engine connections closed for sending no HELLO in time.", s.handshake_timeouts);
  m.one("kvpark_unsealed_quota_refusals_total", "counter",
        "Reservations refused (LIMIT_EXCEEDED) for a connection's or a uid's quota of "
        "reserved, unsealed bytes.",
        s.unsealed_quota_refusals);
  m.one("kvpark_reservations_expired_total", "counter",
        "Reservations left unsealed past the deadline: aborted, their space given back.",
        s.reservations_expired);
  m.one("kvpark_connections_displaced_total", "counter",
        "Idle connections of a process over its share closed to admit another process of "
        "the same uid at its connection cap.",
        s.connections_displaced);
  m.one("kvpark_disk_read_only", "gauge", "1 when the disk tier is served read-only.",
        s.disk_read_only ? 1 : 0);
  m.one("kvpark_seal_corrupt_total", "counter", "Seals refused for a damaged entry header.",
        s.seal_corrupt);
  m.histogram("kvpark_spill_duration_seconds",
              "Time to write one entry to the disk tier until it is durable.", s.spill_latency);
  m.histogram("kvpark_restore_duration_seconds",
              "Time to bring one entry back from disk into the arena, checksums verified.",
              s.restore_latency);
  m.one("kvpark_spills_total", "counter", "Entries written to the disk tier.", s.spills);
  m.one("kvpark_spill_bytes_total", "counter", "Bytes written to the disk tier.", s.spill_bytes);
  m.one("kvpark_restores_total", "counter", "Entries promoted from disk to host.", s.restores);
  m.one("kvpark_restore_bytes_total", "counter", "Bytes promoted from disk to host.",
        s.restore_bytes);
  m.one("kvpark_checksum_failures_total", "counter", "Disk records whose checksum failed.",
        s.checksum_failures);
  m.one("kvpark_corrupt_payloads_total", "counter",
        "Host payloads engines found altered at restore (dropped, never served).", s.corrupt_payloads);
  m.one("kvpark_corrupt_reports_refuted_total", "counter",
        "Engine reports of an altered payload that the daemon found intact (entry kept).",
        s.corrupt_reports_refuted);
  m.one("kvpark_disk_io_errors_total", "counter", "Disk tier I/O errors.", s.disk_io_errors);
  m.family("kvpark_spill_failures_total", "counter",
           "Spills that failed (the entry stays in memory), by cause: no_space (the file "
           "system is full), io_error, read_only (mounted read-only under the daemon), "
           "damaged_header (the entry's arena header failed its check).");
  m.sample(s.spill_failures_no_space, label("cause", "no_space"));
  m.sample(s.spill_failures_io_error, label("cause", "io_error"));
  m.sample(s.spill_failures_read_only, label("cause", "read_only"));
  m.sample(s.spill_failures_damaged_header, label("cause", "damaged_header"));
  if (s.remote_enabled) {
    m.one("kvpark_remote_up", "gauge", "1 when the remote store answered the last job.",
          s.remote_up ? 1 : 0);
    m.one("kvpark_remote_nodes_known", "gauge", "Remote store nodes the client knows.",
          s.remote_nodes_known);
    m.one("kvpark_remote_nodes_up", "gauge", "Remote store nodes not backing off.", s.remote_nodes_up);
    m.one("kvpark_remote_hits_total", "counter", "Entries restored from the remote store, verified.",
          s.remote_hits);
    m.one("kvpark_remote_hit_bytes_total", "counter", "Arena bytes restored from the remote store.",
          s.remote_hit_bytes);
    m.one("kvpark_remote_probes_total", "counter", "Existence checks of lookups' missing chains.",
          s.remote_probes);
    m.one("kvpark_remote_writes_total", "counter", "Entries written behind to the remote store.",
          s.remote_writes);
    m.one("kvpark_remote_writes_failed_total", "counter",
          "Write-behinds that could not reach the store or were refused.", s.remote_writes_failed);
    m.one("kvpark_remote_writes_dropped_total", "counter",
          "Write-behinds skipped: the queue was full.", s.remote_writes_dropped);
    m.one("kvpark_remote_writes_pending", "gauge",
          "Write-behinds accepted and not finished yet (queued or being written).",
          s.remote_writes_pending);
    m.one("kvpark_remote_writes_refused_total", "counter",
          "Values the remote store refused (e.g. OOM under maxmemory).", s.remote_writes_refused);
    m.one("kvpark_remote_read_bytes_total", "counter", "Bytes read from the remote store.",
          s.remote_bytes_in);
    m.one("kvpark_remote_written_bytes_total", "counter", "Bytes written to the remote store.",
          s.remote_bytes_out);
    m.one("kvpark_remote_errors_total", "counter", "Remote jobs that could not reach the store.",
          s.remote_errors);
    m.one("kvpark_remote_corrupt_total", "counter",
          "Remote values that failed a check (missed and deleted).", s.remote_corrupt);
    m.one("kvpark_remote_rejected_total", "counter",
          "Remote entries the daemon's own checks refused (chain hash, geometry).", s.remote_rejected);
    m.one("kvpark_remote_read_bytes_per_second", "gauge",
          "Remote read bandwidth restores measured (a load-versus-recompute input).",
          s.remote_read_bytes_per_second);
    m.family("kvpark_remote_read_latency_seconds", "gauge",
             "Remote latency per restore, measured by small ones (a load-versus-recompute input).");
    m.sample_double(static_cast<double>(s.remote_read_latency_usec) * 1e-6);
    m.one("kvpark_remote_redirects_total", "counter", "Redis Cluster MOVED/ASK redirections followed.",
          s.remote_redirects);
    m.histogram("kvpark_remote_probe_duration_seconds",
                "The remote worker's time on one existence check of a lookup's missing chain.",
                s.remote_probe_latency);
    m.histogram("kvpark_remote_restore_duration_seconds",
                "The remote worker's time streaming one entry from the store into the arena "
                "(every attempt, verified or not).",
                s.remote_get_latency);
    m.histogram("kvpark_remote_write_duration_seconds",
                "The remote worker's time on one write-behind (written, already present, or failed).",
                s.remote_write_latency);
    m.histogram("kvpark_remote_queue_duration_seconds",
                "How long one remote job (any kind) waited for the worker before it started.",
                s.remote_queue_latency);
  }
  m.one("kvpark_arena_adopted", "gauge",
        "1 when this instance adopted the previous instance's arena (the service manager kept it).",
        s.arena_adopted ? 1 : 0);
  m.one("kvpark_adopted_entries", "gauge", "Entries adopted from the previous instance at start.",
        s.adopted_entries);
  m.one("kvpark_adopted_bytes", "gauge", "Arena bytes adopted from the previous instance at start.",
        s.adopted_bytes);
  m.one("kvpark_adopted_reservations", "gauge",
        "Extents the previous instance had reserved when it stopped, held until its engines are "
        "gone.",
        s.adopted_reservations);
  m.family("kvpark_adoption_seconds", "gauge", "Time adoption took at start (records read, index rebuilt).");
  m.sample_double(static_cast<double>(s.adoption_usec) / 1e6);
  m.one("kvpark_adoption_index_kept", "gauge",
        "1 when adoption took the index a clean stop left instead of rebuilding it.",
        s.adoption_index_kept ? 1 : 0);
  m.family("kvpark_adoption_dropped", "gauge", "Records dropped at adoption, by reason (never served).");
  m.sample(s.adoption_dropped_damaged, label("reason", "damaged"));
  m.sample(s.adoption_dropped_namespace, label("reason", "namespace"));
  m.sample(s.adoption_dropped_extent, label("reason", "extent"));
  m.sample(s.adoption_dropped_header, label("reason", "header"));
  m.sample(s.adoption_dropped_tail, label("reason", "tail"));
  m.one("kvpark_adoption_hold", "gauge",
        "1 while adopted extents wait for the previous instance's engines before reuse.",
        s.adoption_hold ? 1 : 0);
  return m.take();
}

struct HttpAdapter::Impl {
  http::RouteServer server;
  std::unique_ptr<http::Listener> listener;
};

HttpAdapter::HttpAdapter(Control& control) : control_(control) {}

HttpAdapter::~HttpAdapter() {
  stop();
}

bool HttpAdapter::start(const std::string& host, uint16_t port, std::string& ret_error) {
  auto impl = std::make_unique<Impl>();
  http::RouteServer& server = impl->server;
  server.set_payload_max_length(limits::http_status_body_bytes_max);

  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const StatusInfo status = control_.status();
    res.set_content(render_metrics(status, control_.namespaces()) + http::process_metrics_text(),
                    metrics_content_type);
  });
  // 200 {"status":"ready"} or 503 {"status":STATE,"reasons":[...]} (control.h HealthInfo).
  server.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const HealthInfo h = control_.health();
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("status");
    w.String(h.state.c_str());
    if (!h.reasons.empty()) {
      w.Key("reasons");
      w.StartArray();
      for (const std::string& reason : h.reasons) w.String(reason.c_str());
      w.EndArray();
    }
    w.EndObject();
    res.status = h.ready ? 200 : 503;
    res.set_content(std::string(buffer.GetString()) + "\n", json_content_type);
  });
  server.Get("/v1/status", [this](const httplib::Request&, httplib::Response& res) {
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    write_status(w, control_.status());
    send_json(res, buffer);
  });
  server.Get("/v1/namespaces", [this](const httplib::Request&, httplib::Response& res) {
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("namespaces");
    w.StartArray();
    for (const NamespaceSummary& n : control_.namespaces()) write_namespace(w, n);
    w.EndArray();
    w.EndObject();
    send_json(res, buffer);
  });
  server.Get("/v1/entries", [this](const httplib::Request& req, httplib::Response& res) {
    EntryFilter filter;
    std::string error;
    if (!parse_entry_filter(req, filter, error)) return json_error(res, 400, error);
    uint64_t total = 0;
    const std::vector<EntrySummary> page = control_.entries(filter, total);
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    w.StartObject();
    w.Key("total");
    w.Uint64(total);
    w.Key("offset");
    w.Uint64(filter.offset);
    w.Key("limit");
    w.Uint64(filter.limit);
    w.Key("entries");
    w.StartArray();
    for (const EntrySummary& e : page) write_entry(w, e);
    w.EndArray();
    w.EndObject();
    send_json(res, buffer);
  });
  server.Get(R"(/v1/entries/([0-9]+))", [this](const httplib::Request& req,
                                                httplib::Response& res) {
    uint64_t id = 0;
    if (!parse_count(req.matches[1].str(), id)) {
      return json_error(res, 400, "entry id must be a decimal number");
    }
    EntrySummary e;
    if (const Status s = control_.entry(id, e); s != Status::Ok) {
      return json_error(res, s == Status::NotFound ? 404 : 503,
                        "entry " + std::to_string(id) +
                            (s == Status::NotFound ? ": not found" : ": kvparkd is stopping"));
    }
    rapidjson::StringBuffer buffer;
    JsonWriter w(buffer);
    write_entry(w, e);
    send_json(res, buffer);
  });
  const auto refuse = [](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Allow", "GET, HEAD");
    json_error(res, 405, "method " + req.method + " not allowed; this API is read-only");
  };
  server.Post(".*", refuse);
  server.Put(".*", refuse);
  server.Patch(".*", refuse);
  server.Delete(".*", refuse);
  server.Options(".*", refuse);
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a route already wrote its error
    json_error(res, res.status,
               res.status == 404 ? "no such path: " + req.path : std::string("bad request"));
  });

  // Slow or oversized clients are held off in front of the workers (http/listener.h).
  impl->listener = std::make_unique<http::Listener>(
      server, http::ListenerOptions{.host = host,
                                    .port = port,
                                    .worker_threads = http_worker_threads,
                                    .body_bytes_max = limits::http_status_body_bytes_max});
  if (!impl->listener->bind(ret_error)) return false;
  port_ = impl->listener->port();
  impl->listener->start();
  impl_ = std::move(impl);
  return true;
}

void HttpAdapter::stop() {
  if (!impl_) return;
  impl_->listener->stop();
  impl_.reset();
}

}  // namespace kvpark::daemon
