// Operator queries and commands over Park and EntryTable (see control_plane.h).
#include "daemon/clock.h"
#include "daemon/control_plane.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <ctime>

#include "daemon/disk_tier.h"
#include "daemon/remote_tier.h"
#include "daemon/runtime_limits.h"

namespace kvpark::daemon {
namespace {

bool tier_matches(Tier wanted, Tier actual) {
  return (static_cast<uint8_t>(wanted) & static_cast<uint8_t>(actual)) != 0;
}

}  // namespace

ControlPlane::ControlPlane(ControlPlaneOptions options, Park& park, EntryTable& table,
                           LoopQueue& loop)
    : options_(std::move(options)), park_(park), table_(table), loop_(loop) {}

StatusInfo ControlPlane::status_in_loop() const {
  StatusInfo s;
  s.version = options_.version;
  s.incarnation = options_.incarnation;
  s.uptime_usec = monotonic_usec() - options_.start_usec;
  s.socket_path = options_.socket_path;
  s.arena_pages = options_.arena_pages;
  s.arena_page_bytes = options_.arena_page_bytes;
  s.arena_data_bytes = table_.data_bytes();
  s.arena_free_bytes = table_.bytes_free();
  s.arena_used_bytes = table_.data_bytes() - table_.bytes_free();
  s.arena_largest_free_bytes = table_.largest_free_bytes();
  s.arena_low_water_bytes = park_.low_water_bytes();
  s.reservation_bytes_max = park_.reservation_bytes_max();
  s.blocks = table_.blocks();
  s.snapshots = table_.snapshots();
  s.entries = s.blocks + s.snapshots;
  s.pinned = table_.pinned();
  s.namespaces = table_.namespace_count();
  s.namespaces_reused = table_.namespaces_reused();
  s.connections = park_.connection_count();
  s.leases = park_.leases_open();
  s.reservations = park_.reservations_open();
  const Counters& c = park_.counters();
  s.lookups = c.lookups;
  s.lookup_hit_tokens = c.lookup_hit_tokens;
  s.restored_tokens = c.restored_tokens;
  s.reuse_root = c.reuse[static_cast<size_t>(ReuseKind::Root)];
  s.reuse_shared_stable_prefix = c.reuse[static_cast<size_t>(ReuseKind::SharedStablePrefix)];
  s.reuse_private_turn_closure = c.reuse[static_cast<size_t>(ReuseKind::PrivateTurnClosure)];
  s.evictions = table_.evictions();
  s.evictions_for_room = table_.room_evictions();
  s.evictions_for_room_bytes = table_.room_eviction_bytes();
  s.evictions_for_low_water = table_.evictions() - table_.room_evictions();
  s.dedup_hits = c.dedup_hits;
  s.protocol_errors = c.protocol_errors;
  s.handshake_timeouts = c.handshake_timeouts;
  s.connections_displaced = c.connections_displaced;
  s.unsealed_quota_refusals = c.unsealed_quota_refusals;
  s.reservations_expired = c.reservations_expired;
  s.unsealed_connection_bytes_max = park_.unsealed_connection_bytes_max();
  s.unsealed_uid_bytes_max = park_.unsealed_uid_bytes_max();
  s.seal_corrupt = c.seal_corrupt;
  s.spills = c.spills;
  s.spill_bytes = c.spill_bytes;
  s.spill_failures = c.spill_failures;
  s.spill_failures_no_space = c.spill_failures_by_cause[size_t(SpillFailure::no_space)];
  s.spill_failures_io_error = c.spill_failures_by_cause[size_t(SpillFailure::io_error)];
  s.spill_failures_read_only = c.spill_failures_by_cause[size_t(SpillFailure::read_only)];
  s.spill_failures_damaged_header =
      c.spill_failures_by_cause[size_t(SpillFailure::damaged_header)];
  s.restores = c.promotions;
  s.restore_bytes = c.promotion_bytes;
  s.checksum_failures = c.checksum_failures;
  s.corrupt_payloads = c.corrupt_payloads;
  s.corrupt_reports_refuted = c.corrupt_reports_refuted;
  s.spill_latency = c.spill_latency;
  s.restore_latency = c.promotion_latency;
  const AdoptionReport& a = options_.adoption;
  s.arena_adopted = a.adopted;
  s.adoption_hold = park_.adoption_held();
  s.adoption = a.adopted ? a.summary() : "";
  s.fresh_start_reason = options_.fresh_start_reason;
  s.adopted_entries = a.entries;
  s.adopted_bytes = a.bytes;
  s.adoption_usec = a.usec;
  s.adopted_reservations = a.reservations;
  s.adopted_reservation_bytes = a.reservation_bytes;
  s.adoption_index_kept = a.index_image;
  s.adoption_dropped = a.dropped_total();
  s.adoption_dropped_damaged = a.dropped[static_cast<size_t>(DropReason::Damaged)];
  s.adoption_dropped_namespace = a.dropped[static_cast<size_t>(DropReason::Namespace)];
  s.adoption_dropped_extent = a.dropped[static_cast<size_t>(DropReason::Extent)];
  s.adoption_dropped_header = a.dropped[static_cast<size_t>(DropReason::Header)];
  s.adoption_dropped_tail = a.dropped[static_cast<size_t>(DropReason::Tail)];
  if (DiskTier* disk = park_.disk()) {
    const disk::DiskStats d = disk->store().stats();
    s.disk_enabled = true;
    s.disk_directory = disk->directory();
    s.disk_read_only = disk->read_only();
    s.disk_bytes = table_.disk_bytes();
    s.disk_capacity_bytes = disk->capacity_bytes();
    s.disk_write_budget_bytes_per_day = disk->write_budget_bytes_per_day();
    s.disk_written_today_bytes = disk->written_today_bytes();
    s.disk_io_errors = d.io_errors;
  }
  if (RemoteTier* remote = park_.remote()) {
    const RemoteTierStats r = remote->stats();
    s.remote_enabled = true;
    s.remote_up = r.up;
    s.remote_cluster = r.cluster;
    s.remote_seeds = remote->seeds_text();
    s.remote_write = remote_write_name(remote->write_policy());
    s.remote_nodes_known = r.nodes_known;
    s.remote_nodes_up = r.nodes_up;
    s.remote_hits = c.remote_promotions;
    s.remote_hit_bytes = c.remote_promotion_bytes;
    s.remote_probes = r.probes;
    s.remote_probe_keys = r.probe_keys;
    s.remote_writes = r.puts;
    s.remote_writes_present = r.puts_present;
    s.remote_writes_failed = r.puts_failed;
    s.remote_writes_dropped = r.puts_dropped;
    s.remote_writes_pending = r.puts_pending;
    s.remote_writes_refused = r.writes_refused;
    s.remote_bytes_in = r.bytes_in;
    s.remote_bytes_out = r.bytes_out;
    s.remote_errors = r.errors;
    s.remote_corrupt = r.corrupt_values;
    s.remote_rejected = c.remote_rejected;
    s.remote_redirects = r.redirects;
    s.remote_read_bytes_per_second = static_cast<uint64_t>(remote->read_bytes_per_second());
    s.remote_read_latency_usec = static_cast<uint64_t>(remote->read_latency_usec());
    s.remote_probe_latency = r.probe_latency;
    s.remote_get_latency = r.get_latency;
    s.remote_write_latency = r.put_latency;
    s.remote_queue_latency = r.queue_latency;
  }
  return s;
}

StatusInfo ControlPlane::status() {
  return loop_.call<StatusInfo>([this] { return status_in_loop(); }).value_or(StatusInfo{});
}

std::vector<NamespaceSummary> ControlPlane::namespaces() {
  return loop_
      .call<std::vector<NamespaceSummary>>([this] {
        std::vector<NamespaceSummary> out;
        for (size_t i = 0; i < table_.namespace_count(); ++i) {
          const NamespaceInfo& info = table_.namespace_info(static_cast<NamespaceIndex>(i));
          out.push_back({.id = info.id,
                         .geometry = info.geometry,
                         .chain_tokens = info.chain_tokens,
                         .prefill_tokens_per_second = info.prefill_tokens_per_second,
                         .blocks = info.blocks,
                         .snapshots = info.snapshots,
                         .host_bytes = info.bytes,
                         .disk_bytes = info.disk_bytes,
                         .restorable_tokens = info.restorable_tokens,
                         .restored_tokens = info.restored_tokens});
        }
        return out;
      })
      .value_or(std::vector<NamespaceSummary>{});
}

EntrySummary ControlPlane::summarize(EntrySlot slot, uint64_t now_usec) const {
  const Entry& e = table_.entry(slot);
  const Tier tier = e.on_host && e.on_disk ? Tier::Both : e.on_disk ? Tier::Disk : Tier::Host;
  return {.id = table_.entry_id(slot),
          .namespace_id = table_.namespace_info(e.ns).id,
          .kind = e.kind,
          .tier = tier,
          .key_hash = e.key_hash,
          .position = e.position,
          .tail_tokens = static_cast<uint32_t>(e.tail_tokens.size()),
          .bytes = e.on_host ? e.extent_bytes : e.disk_bytes,
          .entry_class = e.entry_class,
          .evidence = e.evidence,
          .hits = e.hits,
          .idle_usec = now_usec > e.last_use_usec ? now_usec - e.last_use_usec : 0,
          .creator_session = e.creator_session,
          .leases = e.leases,
          .pinned = e.pinned};
}

std::vector<EntrySummary> ControlPlane::entries(const EntryFilter& filter, uint64_t& ret_total) {
  struct Page {
    std::vector<EntrySummary> entries;
    uint64_t total = 0;
  };
  auto page = loop_.call<Page>([this, filter] {
    std::vector<EntrySlot> matching;
    for (EntrySlot slot = 0; slot < table_.slot_count(); ++slot) {
      const Entry& e = table_.entry(slot);
      if (!e.in_use || !e.sealed || e.dead) continue;
      if (filter.namespace_id && table_.namespace_info(e.ns).id != *filter.namespace_id) continue;
      const Tier tier = e.on_host && e.on_disk ? Tier::Both : e.on_disk ? Tier::Disk : Tier::Host;
      if (filter.tier && !tier_matches(*filter.tier, tier)) continue;
      if (filter.entry_class && e.entry_class != *filter.entry_class) continue;
      matching.push_back(slot);
    }
    std::sort(matching.begin(), matching.end(), [this](EntrySlot a, EntrySlot b) {
      return table_.entry(a).last_use_tick > table_.entry(b).last_use_tick;
    });
    Page p;
    p.total = matching.size();
    const uint64_t now = coarse_monotonic_usec();
    for (uint64_t i = filter.offset; i < matching.size() && i - filter.offset < filter.limit; ++i) {
      p.entries.push_back(summarize(matching[i], now));
    }
    return p;
  });
  ret_total = page ? page->total : 0;
  return page ? std::move(page->entries) : std::vector<EntrySummary>{};
}

Status ControlPlane::entry(uint64_t id, EntrySummary& ret_entry) {
  auto found = loop_.call<std::optional<EntrySummary>>([this, id]() -> std::optional<EntrySummary> {
    const EntrySlot slot = table_.slot_for_id(id);
    if (slot == no_slot || !table_.entry(slot).sealed) return std::nullopt;
    return summarize(slot, coarse_monotonic_usec());
  });
  if (!found) return Status::Unavailable;
  if (!*found) return Status::NotFound;
  ret_entry = **found;
  return Status::Ok;
}

Status ControlPlane::pin(uint64_t id, bool pinned) {
  return loop_
      .call<Status>([this, id, pinned] {
        const EntrySlot slot = table_.slot_for_id(id);
        if (slot == no_slot || !table_.entry(slot).sealed) return Status::NotFound;
        table_.set_pinned(slot, pinned);
        return Status::Ok;
      })
      .value_or(Status::Unavailable);
}

Status ControlPlane::evict(uint64_t id, std::string& ret_message) {
  struct Result {
    Status status;
    std::string message;
  };
  auto r = loop_.call<Result>([this, id]() -> Result {
    const std::string what = "entry " + std::to_string(id);
    const EntrySlot slot = table_.slot_for_id(id);
    if (slot == no_slot || !table_.entry(slot).sealed) return {Status::NotFound, what + ": not found"};
    const Entry& e = table_.entry(slot);
    if (e.pinned) {
      return {Status::BadState, what + " is pinned: unpin it first (kvparkctl unpin " +
                                    std::to_string(id) + ")"};
    }
    if (e.leases > 0) {
      return {Status::BadState, what + " is in use: " + std::to_string(e.leases) +
                                    " lease(s) of engines restoring it; try again when they end"};
    }
    if (e.io_pins > 0) {
      return {Status::BadState, what + " is being written to or read from disk; try again"};
    }
    const Status s = park_.evict_entry(slot);
    return {s, s == Status::Ok ? "" : what + ": " + std::string(status_name(s))};
  });
  if (!r) return Status::Unavailable;
  ret_message = r->message;
  return r->status;
}

Status ControlPlane::drop_namespace(const NamespaceId& id, uint64_t& ret_dropped) {
  struct Result {
    Status status;
    uint64_t dropped;
  };
  auto r = loop_.call<Result>([this, id] {
    uint64_t dropped = 0;
    Status s = park_.drop_namespace(id, dropped);
    return Result{s, dropped};
  });
  if (!r) return Status::Unavailable;
  ret_dropped = r->dropped;
  return r->status;
}

HealthInfo ControlPlane::health() {
  if (!serving_) {
    return {.ready = false,
            .state = stopped_ ? "stopping" : "starting",
            .reasons = {stopped_ ? "kvparkd is stopping" : "kvparkd has not finished starting"}};
  }
  auto r = loop_.call<HealthInfo>(
      [this] {
        HealthInfo h{.ready = true, .state = "ready", .reasons = {}};
        if (!options_.disk_failure.empty()) {
          h.reasons.push_back("disk tier off: " + options_.disk_failure);
        } else if (const DiskTier* disk = park_.disk(); disk != nullptr && disk->read_only()) {
          h.reasons.push_back("disk tier at " + disk->directory() +
                              " is read-only: nothing is spilled there");
        }
        if (!h.reasons.empty()) h = {.ready = false, .state = "degraded", .reasons = h.reasons};
        return h;
      },
      limits::health_loop_timeout_usec);
  if (r) return *r;
  if (!serving_) return {.ready = false, .state = "stopping", .reasons = {"kvparkd is stopping"}};
  return {.ready = false,
          .state = "stuck",
          .reasons = {"the event loop did not answer within " +
                      std::to_string(limits::health_loop_timeout_usec / 1000) + " ms"}};
}

Status ControlPlane::set_limit(const std::string& name, uint64_t value, const std::string& caller,
                               std::string& ret_message) {
  struct Result {
    Status status;
    std::string message;
  };
  auto r = loop_.call<Result>([this, name, value, caller]() -> Result {
    LimitBounds bounds{.arena_bytes = table_.data_bytes()};
    if (DiskTier* disk = park_.disk()) {
      bounds.disk_enabled = true;
      bounds.disk_directory = disk->directory();
      struct statvfs fs {};
      bounds.disk_filesystem_bytes = statvfs(disk->directory().c_str(), &fs) == 0
                                         ? uint64_t(fs.f_blocks) * fs.f_frsize
                                         : UINT64_MAX;  // unknown: no upper bound
    }
    std::string message;
    const Status s = check_runtime_limit(name, value, bounds, message);
    if (s != Status::Ok) return {s, message};
    uint64_t old_value = 0;
    const Status applied = apply_limit(name, value, old_value);
    if (applied == Status::Ok && options_.limit_changed) {
      options_.limit_changed({.name = name, .old_value = old_value, .new_value = value, .caller = caller});
    }
    return {applied, message};
  });
  if (!r) return Status::Unavailable;
  ret_message = r->message;
  return r->status;
}

Status ControlPlane::apply_limit(const std::string& name, uint64_t value, uint64_t& ret_old_value) {
  if (name == limit_arena_low_water) {
    ret_old_value = park_.low_water_bytes();
    park_.set_low_water_bytes(value);
    park_.tick();
    return Status::Ok;
  }
  if (name == limit_reservation_max) {
    ret_old_value = park_.reservation_bytes_max();
    park_.set_reservation_bytes_max(value);
    return Status::Ok;
  }
  DiskTier* disk = park_.disk();
  if (disk == nullptr) return Status::BadState;  // check_runtime_limit said so
  if (name == limit_disk_capacity) {
    ret_old_value = disk->capacity_bytes();
    disk->set_capacity_bytes(value);
    park_.tick();
  } else if (name == limit_disk_write_budget) {
    ret_old_value = disk->write_budget_bytes_per_day();
    disk->set_write_budget_bytes_per_day(value);
  } else {
    return Status::InvalidArgument;
  }
  return Status::Ok;
}

Status ControlPlane::start_flush(uint64_t& ret_job_id) {
  struct Result {
    Status status;
    uint64_t job;
  };
  auto r = loop_.call<Result>([this] {
    uint64_t job = 0;
    Status s = park_.start_flush(true, job);
    return Result{s, job};
  });
  if (!r) return Status::Unavailable;
  ret_job_id = r->job;
  return r->status;
}

Status ControlPlane::flush_progress(uint64_t job_id, FlushProgress& ret_progress) {
  auto r = loop_.call<std::optional<FlushProgress>>([this, job_id]() -> std::optional<FlushProgress> {
    const FlushProgress& f = park_.flush_state();
    if (f.job_id != job_id || job_id == 0) return std::nullopt;
    return f;
  });
  if (!r) return Status::Unavailable;
  if (!*r) return Status::NotFound;
  ret_progress = **r;
  return Status::Ok;
}

Status ControlPlane::reload_config(std::string& ret_message) {
  if (!options_.reload) {
    ret_message = "kvparkd runs without a configuration file";
    return Status::BadState;
  }
  struct Result {
    Status status;
    std::string message;
  };
  auto r = loop_.call<Result>([this] {
    Result result{};
    result.status = options_.reload(result.message);
    return result;
  });
  if (!r) return Status::Unavailable;
  ret_message = r->message;
  return r->status;
}

}  // namespace kvpark::daemon
