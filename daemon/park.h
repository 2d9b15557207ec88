// The daemon core: what each verb does, per connection, over the entry table,
// and the policies that move entries between host and disk.
//
// A connection is the scope of every lease and reservation it creates; close()
// is the one cleanup routine that aborts its open reservations, drops its leases
// and forgets its waits, whether the client said goodbye, crashed or sent
// garbage. The core knows nothing of sockets, D-Bus or HTTP; the server feeds it
// decoded requests and sends what it answers (WAIT answers later, through the
// reply sink). Single-threaded: the daemon's event loop owns it.
//
// Disk policy (when a DiskTier is attached): shared or explicitly marked entries
// are written through at seal; tick() keeps the arena's free bytes above the
// low-water mark by demoting the coldest entries worth keeping to disk and
// dropping the rest; a LOOKUP that reaches disk-only entries promotes them into
// the arena asynchronously; disk capacity is kept by evicting cold records.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/control.h"
#include "daemon/entry_table.h"
#include "proto/limits.h"
#include "proto/wire.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

class DiskTier;
class RemoteTier;
struct RemoteCompletion;
using ConnectionId = uint32_t;
}  // namespace kvpark::daemon
namespace kvpark::disk {
struct RecoveryReport;
struct RecordInfo;
}
namespace kvpark::daemon {

struct ParkOptions {
  uint8_t* arena_data = nullptr;  // the daemon's mapping of the data region
  uint64_t arena_data_bytes = 0;  // the data object, for HELLO replies
  uint32_t arena_pages = 0;       // shm::ArenaPages, for STATS
  uint32_t arena_page_bytes = 0;
  uint64_t incarnation = 0;
  uint64_t reservation_bytes_max = 0;  // one reservation's extents, bytes
  size_t connections_max = 0;
  DiskTier* disk = nullptr;            // null: host tier only
  RemoteTier* remote = nullptr;        // null: no remote tier (park_remote.cpp)
  EntryState* state = nullptr;         // null: no state segment (nothing to adopt later)
};

inline constexpr size_t spills_in_flight_max = 16;
// Client-reachable caps live in proto/limits.h.
using limits::recurrence_chunks_max;
using limits::wait_timeout_msec_max;
using limits::waits_max;
// Recurrence detection: how far past the restorable prefix two sessions must agree
// before a capture hint.
// Value model. Prefill rate assumed for namespaces that did not declare one: 16,484
// tokens in 2.36 s (DESIGN.md §1).
inline constexpr uint32_t prefill_tokens_per_second_default = 7000;
// Reuse likelihood halves every half-life since last use: a private continuation is
// likely to return within minutes or not at all; a shared head stays useful for hours.
inline constexpr uint64_t private_half_life_usec = 10ull * 60 * 1'000'000;
inline constexpr uint64_t shared_half_life_usec = 6ull * 3600 * 1'000'000;
// A private continuation younger than this is worth a disk write (a returning session).
inline constexpr uint64_t private_keep_usec = private_half_life_usec;
inline constexpr uint32_t recurrence_tokens_min = 1024;

struct Counters {
  uint64_t lookups = 0;
  uint64_t lookup_hit_tokens = 0;  // found restorable by lookups
  uint64_t restored_tokens = 0;    // restored, as clients report at release
  uint64_t dedup_hits = 0;
  uint64_t protocol_errors = 0;
  uint64_t handshake_timeouts = 0;
  uint64_t seal_corrupt = 0;
  uint64_t reuse[reuse_kind_max + 1] = {};
  uint64_t spills = 0;           // completed
  uint64_t spill_bytes = 0;
  uint64_t spill_failures = 0;
  uint64_t promotions = 0;       // completed disk -> host restores
  uint64_t promotion_bytes = 0;
  uint64_t promotion_failures = 0;
  uint64_t checksum_failures = 0;
  uint64_t corrupt_payloads = 0;  // host payloads engines found altered (REPORT_CORRUPT)
  uint64_t unreachable_records_removed = 0;  // at recovery: their chain did not reach them
  uint64_t chain_spills_dropped = 0;  // written, but the predecessor's spill failed
  uint64_t budget_refusals = 0;  // spills skipped: daily write budget spent
  uint64_t recompute_instead = 0;  // disk entries not promoted: recomputing is faster
  LatencyHistogram spill_seconds;
  LatencyHistogram promotion_seconds;
  uint64_t remote_promotions = 0;  // remote -> host, verified and sealed
  uint64_t remote_promotion_bytes = 0;
  uint64_t remote_rejected = 0;    // fetched but failed the daemon's checks (chain hash, header)
};

// Progress of a flush (operator command or planned shutdown): control.h's view of it.
using FlushState = FlushProgress;

class Park {
 public:
  using ReplySink = std::function<void(ConnectionId, std::vector<uint8_t>&&)>;

  Park(const ParkOptions& options, EntryTable& table);

  Status open(ConnectionId id, uint32_t peer_pid);
  // Aborts the connection's reservations, releases its leases, forgets its waits.
  void close(ConnectionId id);

  Status hello(ConnectionId id, const wire::HelloRequest& req, wire::HelloReply& ret);
  Status lookup(ConnectionId id, const wire::LookupRequest& req, wire::LookupReply& ret);
  Status release(ConnectionId id, const wire::ReleaseRequest& req);
  // Answers at once (true, ret filled) or later through the reply sink (false).
  bool wait(ConnectionId id, uint32_t sequence, const wire::WaitRequest& req, Status& ret_status,
            wire::LookupReply& ret);
  Status reserve_blocks(ConnectionId id, const wire::ReserveBlocksRequest& req,
                        wire::ReserveBlocksReply& ret);
  Status reserve_snapshot(ConnectionId id, const wire::ReserveSnapshotRequest& req,
                          wire::ReserveSnapshotReply& ret);
  Status seal(ConnectionId id, const wire::ReservationRequest& req);
  Status abort(ConnectionId id, const wire::ReservationRequest& req);
  // An engine found a leased entry's payload failing its checksum: the entry is
  // dropped (never served again) and counted. Only entries of the connection's own
  // leases can be reported; anything else is ignored.
  void report_corrupt(ConnectionId id, const wire::CorruptReport& req);
  wire::StatsReply stats() const;

  void set_reply_sink(ReplySink sink) { reply_sink_ = std::move(sink); }

  // Operator commands (see control.h); they never touch leased entries.
  Status evict_entry(EntrySlot slot);
  Status drop_namespace(const NamespaceId& id, uint64_t& ret_dropped);
  void set_reservation_bytes_max(uint64_t bytes) { options_.reservation_bytes_max = bytes; }
  uint64_t reservation_bytes_max() const { return options_.reservation_bytes_max; }
  // Keeps at least this many arena bytes free on tick(): demotes or evicts.
  void set_low_water_bytes(uint64_t bytes) { low_water_bytes_ = bytes; }
  uint64_t low_water_bytes() const { return low_water_bytes_; }
  // Periodic work: WAIT deadlines, low-water demotion, flush progress, the end of
  // the adoption hold.
  void tick();

  // After adoption: adopted entries are not evicted (their extents not reused) while
  // a lease of the previous instance may still be read, i.e. until every engine in
  // `pids` has said HELLO again or exited, or until deadline_usec (CLOCK_MONOTONIC).
  void hold_adopted(const std::vector<uint32_t>& pids, uint64_t deadline_usec);
  bool adoption_held() const { return holding_; }
  size_t previous_engines_waited_for() const { return previous_pids_.size(); }

  // Disk tier (no-ops without one).
  DiskTier* disk() const { return options_.disk; }
  // Indexes the records the disk tier found at start; returns how many it skipped.
  uint64_t recover(const disk::RecoveryReport& report);
  void on_disk_completions();  // the disk tier's notify fd is readable
  // Writes host-only entries to disk: all of them (operator flush) or only those
  // worth keeping (planned shutdown). BadState without a disk tier.
  Status start_flush(bool everything, uint64_t& ret_job_id);
  const FlushState& flush_state() const { return flush_; }
  bool disk_idle() const { return jobs_.empty(); }

  // Remote tier (park_remote.cpp; no-ops without one).
  RemoteTier* remote() const { return options_.remote; }
  void on_remote_completions();  // the remote tier's notify fd is readable

  const Counters& counters() const { return counters_; }
  size_t spills_waiting_for_predecessor() const { return waiting_spills_.size(); }
  size_t connection_count() const { return connections_.size(); }
  uint64_t leases_open() const { return leases_open_; }
  uint64_t reservations_open() const { return reservations_open_; }
  void count_protocol_error() { ++counters_.protocol_errors; }
  void count_handshake_timeout() { ++counters_.handshake_timeouts; }

 private:
  struct Reservation {
    std::vector<EntrySlot> slots;
    std::vector<shm::EntryHeader> headers;  // as written; checked again at seal
  };
  struct Lease {
    uint64_t session_id = 0;
    uint32_t prompt_tokens = 0;
    std::vector<EntrySlot> blocks;     // chain order
    std::vector<EntrySlot> snapshots;  // deepest first
    // Single flight: entries past the prefix that other engines were writing at
    // LOOKUP time (slot, entry id); WAIT returns when they are sealed or gone.
    std::vector<std::pair<EntrySlot, uint64_t>> inflight;
    uint32_t inflight_tokens = 0;
    uint32_t capture_hint_tokens = 0;
    bool remote_pending = false;  // the remote tier's existence check is still out
  };
  struct RecurrenceSeen {
    uint64_t session_id = 0;
    bool recurring = false;  // seen from two sessions
  };
  struct Connection {
    uint32_t peer_pid = 0;
    uint32_t state_slot = no_record;  // its word in the state segment
    bool greeted = false;
    NamespaceIndex ns = 0;
    std::unordered_map<uint64_t, Lease> leases;
    std::map<uint64_t, Reservation> reservations;
  };
  struct Waiter {
    ConnectionId connection = 0;
    uint32_t sequence = 0;
    uint64_t lease_id = 0;
    uint64_t deadline_usec = 0;  // CLOCK_MONOTONIC
  };
  struct DiskJob {
    bool spill = true;
    uint64_t start_usec = 0;  // CLOCK_MONOTONIC
    EntrySlot slot = no_slot;
    uint64_t entry_id = 0;  // slot + generation, to notice a reused slot (a bug)
    uint64_t flush_job = 0;
  };

  Connection* greeted(ConnectionId id);
  ReuseKind reuse_kind_of(const Entry& e, uint64_t session_id) const;
  shm::EntryHeader make_entry_header(const Entry& e, uint32_t token_count,
                                     uint64_t payload_bytes) const;
  void drop_reservation(Reservation& r);
  // A guarded access to the arena failed: a client took a page away (arena_guard.h).
  void log_arena_fault(uint64_t extent_offset);
  void drop_lease(Lease& lease);
  bool evict_entry_unpinned(EntrySlot slot);  // drop-namespace: pins do not protect
  // Fills a LOOKUP/WAIT answer from a lease's current state.
  void describe_lease(const Connection& c, uint64_t lease_id, const Lease& lease,
                      wire::LookupReply& ret) const;
  bool lease_settled(const Lease& lease) const;  // no promotion in flight
  void answer_waiters(bool expire_only);
  // Notes the chunks past the restorable prefix; returns a capture hint position or 0.
  uint32_t observe_recurrence(NamespaceIndex ns, const wire::LookupRequest& req,
                              uint32_t restorable_tokens, uint32_t chain_tokens);

  // Disk (park_disk.cpp).
  bool worth_keeping(const Entry& e) const;
  // Shared entries and explicit breakpoints are written through at seal.
  static bool write_through(const Entry& e) {
    return e.entry_class == EntryClass::Shared || e.evidence == Evidence::ExplicitBreakpoint;
  }
  // The durability invariant (docs/disk.md): a block's record is written only once its
  // predecessor is durable or being written, and reported durable (on_disk) only once
  // its predecessor is. chain_parent: the predecessor's slot; no_slot for a chain's
  // first block, a snapshot, or a predecessor that is gone (then *ret_gone is set).
  EntrySlot chain_parent(const Entry& e, bool* ret_gone) const;
  bool spilling(EntrySlot slot) const { return spilling_.contains(slot); }
  // Spills `slot` and first whatever of its chain lacks a disk copy; false when the
  // chain cannot become whole (a predecessor is gone or unreadable) or nothing started.
  bool spill_chain(EntrySlot slot, uint64_t flush_job);
  // A spill that completed (or failed): attach, account, demote.
  void finish_spill(const DiskJob& job, Status status, uint64_t bytes, int err);
  // Settles spills that completed before their predecessor did.
  void settle_waiting_spills();
  // Recovery: the records a lookup can reach, in chain order; the rest in ret_unreachable.
  static std::vector<const disk::RecordInfo*> reachable_records(
      const disk::RecoveryReport& report, std::vector<const disk::RecordInfo*>& ret_unreachable);
  // Expected saved prefill seconds per arena byte at now_usec (the value model; see
  // park_disk.cpp).
  double value_density(const Entry& e, uint64_t now_usec) const;
  // Whether reading a disk-only entry beats recomputing it at the engine's rate.
  bool load_beats_recompute(const Entry& e) const;
  // A flush's spills (and their predecessors') are exempt from the write budget.
  bool start_spill(EntrySlot slot, uint64_t flush_job, bool budget_exempt);
  bool start_promotion(EntrySlot slot);  // false: could not place it on the host
  void remove_from_disk(EntrySlot slot);
  void enforce_disk_capacity();
  void keep_low_water();
  void advance_flush();

  // Remote (park_remote.cpp).
  // A sealed entry the write policy sends to the remote store: written behind, pinned
  // until the write completes.
  void remote_write_behind(EntrySlot slot);
  // After a lookup's block walk: whether the remote store should be asked for the
  // chain past it; marks the lease pending (and in flight, so the engine may WAIT).
  bool remote_should_probe(const Connection& c, const wire::LookupRequest& req, Lease& lease);
  void remote_start_probe(ConnectionId id, uint64_t lease_id, const Connection& c,
                          const wire::LookupRequest& req, const Lease& lease);
  void finish_remote_probe(const RemoteCompletion& done);
  void finish_remote_get(const RemoteCompletion& done);
  void expire_remote_probes();

  void end_adoption_hold(const char* why);

  ParkOptions options_;
  EntryTable& table_;
  std::unordered_map<uint32_t, uint32_t> previous_pids_;  // pid -> connections not back yet
  uint64_t hold_deadline_usec_ = 0;
  bool holding_ = false;
  std::unordered_map<ConnectionId, Connection> connections_;
  std::vector<Waiter> waiters_;
  std::unordered_map<Hash128, RecurrenceSeen, Hash128Hasher> recurrence_;  // by chunk hash
  std::vector<Hash128> recurrence_order_;  // insertion order, for bounded forgetting
  size_t recurrence_next_ = 0;
  ReplySink reply_sink_;
  std::unordered_map<uint64_t, DiskJob> jobs_;  // by disk job id
  // Slots with a spill in flight, or written and waiting for their predecessor.
  std::unordered_set<EntrySlot> spilling_;
  struct WaitingSpill {
    DiskJob job;
    uint64_t bytes = 0;  // record file bytes
  };
  std::vector<WaitingSpill> waiting_spills_;
  size_t spills_in_flight_ = 0;
  // Disk read bandwidth seen by promotions: bytes over the time any were in flight.
  double disk_read_bytes_per_second_ = 0;  // EWMA over busy periods; 0: not measured
  size_t promotions_in_flight_ = 0;
  uint64_t promotion_busy_since_usec_ = 0;
  uint64_t promotion_busy_bytes_ = 0;
  std::vector<EntrySlot> flush_queue_;  // slots still to spill for the flush
  FlushState flush_{.done = true};
  uint64_t next_lease_id_ = 1;
  uint64_t next_reservation_id_ = 1;
  uint64_t next_flush_id_ = 1;
  uint64_t leases_open_ = 0;
  uint64_t reservations_open_ = 0;
  uint64_t low_water_bytes_ = 0;
  Counters counters_;
};

}  // namespace kvpark::daemon
