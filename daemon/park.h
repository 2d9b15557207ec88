// The daemon core: what each verb does, per connection, over the entry table.
//
// A connection is the scope of every lease and reservation it creates; close()
// is the one cleanup routine that aborts its open reservations, drops its leases
// and forgets its waits, whether the client said goodbye, crashed or sent
// garbage. The core knows nothing of sockets, D-Bus or HTTP; the server feeds it
// decoded requests and sends what it answers (WAIT answers later, through the
// reply sink). Single-threaded: the daemon's event loop owns it.
//
// Park keeps the verbs and the leases (park.cpp; LOOKUP's steps and WAIT in
// park_lookup.cpp; RESERVE, SEAL and ABORT in park_publish.cpp) and delegates the rest, each to its own part: single flight and
// WAIT (single_flight.h), recurrence hints (recurrence.h), the value model and host
// eviction (value_model.h, eviction_policy.h), the disk tier's traffic
// (disk_mover.h), which asks the tiering policy (tiering_policy.h) what to move, and
// the remote tier's (remote_mover.h).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/control.h"
#include "daemon/counters.h"
#include "daemon/disk_mover.h"
#include "daemon/entry_table.h"
#include "daemon/lease.h"
#include "daemon/recurrence.h"
#include "daemon/remote_mover.h"
#include "daemon/single_flight.h"
#include "daemon/tiering_policy.h"
#include "daemon/value_model.h"
#include "proto/limits.h"
#include "proto/wire.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

class RemoteTier;

struct ParkOptions {
  uint8_t* arena_data = nullptr;  // the daemon's mapping of the data region
  uint64_t arena_data_bytes = 0;  // the data object, for HELLO replies
  uint32_t arena_pages = 0;       // shm::ArenaPages, for STATS
  uint32_t arena_page_bytes = 0;
  uint64_t incarnation = 0;
  uint64_t reservation_bytes_max = 0;  // one reservation's extents, bytes
  // Unsealed extents one connection, one uid may hold (0: no quota).
  uint64_t unsealed_connection_bytes_max = 0;
  uint64_t unsealed_uid_bytes_max = 0;
  size_t connections_max = 0;
  DiskTier* disk = nullptr;            // null: host tier only
  RemoteTier* remote = nullptr;        // null: no remote tier (remote_mover.h)
  EntryState* state = nullptr;         // null: no state segment (nothing to adopt later)
};

class Park {
 public:
  using ReplySink = SingleFlight::ReplySink;

  Park(const ParkOptions& options, EntryTable& table);
  Park(const Park&) = delete;
  Park& operator=(const Park&) = delete;

  // peer_uid: whose unsealed quota (ParkOptions::unsealed_uid_bytes_max) it draws on.
  Status open(ConnectionId id, uint32_t peer_pid, uint32_t peer_uid = 0);
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

  // Operator commands (see control.h); they never touch leased entries. An adopted
  // entry still held for the previous instance's engines leaves the index at once and
  // frees its extent when the hold ends.
  Status evict_entry(EntrySlot slot);
  Status drop_namespace(const NamespaceId& id, uint64_t& ret_dropped);
  void set_reservation_bytes_max(uint64_t bytes) { options_.reservation_bytes_max = bytes; }
  uint64_t reservation_bytes_max() const { return options_.reservation_bytes_max; }
  uint64_t unsealed_connection_bytes_max() const { return options_.unsealed_connection_bytes_max; }
  uint64_t unsealed_uid_bytes_max() const { return options_.unsealed_uid_bytes_max; }
  // Keeps at least this many arena bytes free on tick(): demotes or evicts.
  void set_low_water_bytes(uint64_t bytes) { disk_.policy().set_low_water_bytes(bytes); }
  uint64_t low_water_bytes() const { return disk_.policy().low_water_bytes(); }
  // Periodic work: WAIT deadlines, low-water demotion, flush progress, the end of
  // the adoption hold.
  void tick();
  // The same at a given CLOCK_MONOTONIC instant (tests drive the adoption grace with it).
  void tick_at(uint64_t now_usec);

  // After adoption: adopted entries are not evicted (their extents not reused) while
  // a lease of the previous instance may still be read, i.e. until every engine in
  // `pids` has said HELLO again or exited, or until deadline_usec (CLOCK_MONOTONIC).
  void hold_adopted(const std::vector<uint32_t>& pids, uint64_t deadline_usec);
  bool adoption_held() const { return holding_; }
  size_t previous_engines_waited_for() const { return previous_pids_.size(); }

  // Disk tier (no-ops without one).
  DiskTier* disk() const { return disk_.disk(); }
  // Indexes the records the disk tier found at start; returns how many it skipped.
  uint64_t recover(const disk::RecoveryReport& report) { return disk_.recover(report); }
  void on_disk_completions();  // the disk tier's notify fd is readable
  // Writes host-only entries to disk: all of them (operator flush) or only those
  // worth keeping (planned shutdown). BadState without a disk tier.
  Status start_flush(bool everything, uint64_t& ret_job_id) {
    return disk_.start_flush(everything, ret_job_id);
  }
  const FlushState& flush_state() const { return disk_.flush_state(); }
  bool disk_idle() const { return disk_.idle(); }

  // Remote tier (remote_mover.h; no-ops without one).
  RemoteTier* remote() const { return remote_.tier(); }
  void on_remote_completions();  // the remote tier's notify fd is readable

  const Counters& counters() const { return counters_; }
  size_t spills_waiting_for_predecessor() const { return disk_.spills_waiting_for_predecessor(); }
  size_t connection_count() const { return connections_.size(); }
  uint64_t leases_open() const { return leases_open_; }
  uint64_t reservations_open() const { return reservations_open_; }
  void count_protocol_error() { ++counters_.protocol_errors; }
  void count_handshake_timeout() { ++counters_.handshake_timeouts; }
  // Whether the connection holds nothing: no lease (so no WAIT either), no
  // reservation. Closing such a connection loses its peer nothing but the socket.
  bool idle(ConnectionId id) const {
    const auto it = connections_.find(id);
    return it == connections_.end() ||
           (it->second.leases.empty() && it->second.reservations.empty());
  }
  // A connection closed to admit another process of its uid (Server::displace_for).
  void count_displaced() { ++counters_.connections_displaced; }

 private:
  struct Reservation {
    std::vector<EntrySlot> slots;
    std::vector<shm::EntryHeader> headers;  // as written; checked again at seal
    uint64_t bytes = 0;         // its extents: what it draws on the unsealed quotas
    uint64_t created_usec = 0;  // CLOCK_MONOTONIC; aborted past limits::unsealed_deadline_usec
  };
  struct Connection {
    uint32_t peer_pid = 0;
    uint32_t peer_uid = 0;
    uint64_t unsealed_bytes = 0;  // its open reservations' extents
    uint32_t state_slot = no_record;  // its word in the state segment
    bool greeted = false;
    // It reported an intact payload altered: its reports are not acted on again (each
    // costs a read of the whole payload on the loop).
    bool refuted_report = false;
    NamespaceIndex ns = 0;
    std::unordered_map<uint64_t, Lease> leases;
    std::map<uint64_t, Reservation> reservations;
  };

  Connection* greeted(ConnectionId id);
  shm::EntryHeader make_entry_header(const Entry& e, uint32_t token_count,
                                     uint64_t payload_bytes) const;
  void drop_reservation(Reservation& r);
  // Whether `c` may reserve `bytes` more unsealed (its own and its uid's quota); when
  // not, counts it and logs which quota, and by how much.
  bool unsealed_quota_allows(const Connection& c, uint64_t bytes);
  // Files a new reservation under `c`, on the quotas, and returns its id.
  uint64_t keep_reservation(Connection& c, Reservation&& r);
  // Takes a reservation off `c` and the quotas (its entries are the caller's).
  void forget_reservation(Connection& c, std::map<uint64_t, Reservation>::iterator it);
  // Aborts the reservations left unsealed past limits::unsealed_deadline_usec.
  void expire_reservations(uint64_t now_usec);
  void drop_lease(Lease& lease);
  bool evict_entry_unpinned(EntrySlot slot);  // drop-namespace: pins do not protect
  // Answers the WAITs whose lease settled (expire_only: whose deadline passed).
  void answer_waiters(bool expire_only);

  // LOOKUP's steps (park_lookup.cpp), in order.
  Status check_lookup(const Connection& c, const wire::LookupRequest& req) const;
  // Whether a found entry can be leased: sealed and on the host, or on disk only and
  // now being promoted (when loading it beats recomputing it).
  bool lease_usable(EntrySlot slot);
  // The longest run of sealed blocks, leaving at least one token to prefill.
  void lease_blocks(const wire::LookupRequest& req, Lease& lease);
  // Snapshots deeper than the block prefix, deepest anchor first.
  void lease_snapshots(ConnectionId id, const wire::LookupRequest& req,
                       uint32_t block_restorable, Lease& lease);
  // Snapshot-required namespaces: blocks only up to the deepest candidate's anchor,
  // disk-only ones promoted now.
  void trim_to_snapshots(Lease& lease);
  // Counts a lookup's outcome, tokens found restorable and its reuse kind, once: when
  // its lease is settled (promotions and the remote probe done), or when the lease
  // ends unsettled (`ended`), then only what was readable in memory. `described`:
  // the lease's description as it stands, when the caller has just made it.
  void count_lookup(Lease& lease, bool ended, const wire::LookupReply* described = nullptr);

  // The disk tier's traffic, from the verbs (disk_mover.h).
  bool spill_chain(EntrySlot slot, uint64_t flush_job) { return disk_.spill_chain(slot, flush_job); }
  bool start_promotion(EntrySlot slot) { return disk_.start_promotion(slot); }
  void remove_from_disk(EntrySlot slot) { disk_.remove_from_disk(slot); }
  void keep_low_water() { disk_.keep_low_water(); }
  void advance_flush() { disk_.advance_flush(); }
  static bool write_through(const Entry& e) { return TieringPolicy::write_through(e); }

  Lease* find_lease(ConnectionId id, uint64_t lease_id);

  void end_adoption_hold(const char* why);

  ParkOptions options_;
  EntryTable& table_;
  // pid -> connections not back yet, or previous_engine_until_exit.
  std::unordered_map<uint32_t, uint32_t> previous_pids_;
  // An engine that came back still holding plans of the previous instance.
  static constexpr uint32_t previous_engine_until_exit = UINT32_MAX;
  uint64_t hold_deadline_usec_ = 0;
  bool holding_ = false;
  std::unordered_map<ConnectionId, Connection> connections_;
  uint64_t next_lease_id_ = 1;
  uint64_t next_reservation_id_ = 1;
  uint64_t leases_open_ = 0;
  uint64_t reservations_open_ = 0;
  std::unordered_map<uint32_t, uint64_t> unsealed_by_uid_;  // uid -> its open reservations' bytes
  Counters counters_;
  // The parts Park delegates to (see the top of this file).
  SingleFlight single_flight_{table_};
  Recurrence recurrence_{table_};
  DiskMover disk_;
  RemoteMover remote_;
  ReplySink reply_sink_;
};

}  // namespace kvpark::daemon
