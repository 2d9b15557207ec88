// The daemon core: what each verb does, per connection, over the entry table.
//
// A connection is the scope of every lease and reservation it creates; close()
// is the one cleanup routine that aborts its open reservations and drops its
// leases, whether the client said goodbye, crashed or sent garbage. The core
// knows nothing of sockets, D-Bus or HTTP; the server feeds it decoded requests.
// Single-threaded: the daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "daemon/entry_table.h"
#include "proto/wire.h"
#include "shm/arena_format.h"

namespace kvpark::daemon {

using ConnectionId = uint32_t;

struct ParkOptions {
  uint8_t* arena_data = nullptr;  // the daemon's mapping of the data region
  uint64_t arena_bytes = 0;       // whole shared object, for HELLO replies
  uint64_t incarnation = 0;
  uint64_t reservation_bytes_max = 0;  // one reservation's extents, bytes
  size_t connections_max = 0;
};

struct Counters {
  uint64_t lookups = 0;
  uint64_t lookup_hit_tokens = 0;
  uint64_t dedup_hits = 0;
  uint64_t protocol_errors = 0;
  uint64_t seal_corrupt = 0;
  uint64_t reuse[reuse_kind_max + 1] = {};
};

class Park {
 public:
  Park(const ParkOptions& options, EntryTable& table);

  Status open(ConnectionId id, uint32_t peer_pid);
  // Aborts the connection's reservations and releases its leases. Idempotent.
  void close(ConnectionId id);

  Status hello(ConnectionId id, const wire::HelloRequest& req, wire::HelloReply& ret);
  Status lookup(ConnectionId id, const wire::LookupRequest& req, wire::LookupReply& ret);
  Status release(ConnectionId id, const wire::ReleaseRequest& req);
  Status reserve_blocks(ConnectionId id, const wire::ReserveBlocksRequest& req,
                        wire::ReserveBlocksReply& ret);
  Status reserve_snapshot(ConnectionId id, const wire::ReserveSnapshotRequest& req,
                          wire::ReserveSnapshotReply& ret);
  Status seal(ConnectionId id, const wire::ReservationRequest& req);
  Status abort(ConnectionId id, const wire::ReservationRequest& req);
  wire::StatsReply stats() const;

  // Operator commands (see control.h); they never touch leased entries.
  Status evict_entry(EntrySlot slot);
  Status drop_namespace(const NamespaceId& id, uint64_t& ret_dropped);
  void set_reservation_bytes_max(uint64_t bytes) { options_.reservation_bytes_max = bytes; }
  uint64_t reservation_bytes_max() const { return options_.reservation_bytes_max; }
  // Keeps at least this many arena bytes free, evicting in LRU order on tick().
  void set_low_water_bytes(uint64_t bytes) { low_water_bytes_ = bytes; }
  uint64_t low_water_bytes() const { return low_water_bytes_; }
  void tick();

  uint64_t leases_open() const { return leases_open_; }
  uint64_t reservations_open() const { return reservations_open_; }
  void count_protocol_error() { ++counters_.protocol_errors; }
  const Counters& counters() const { return counters_; }
  size_t connection_count() const { return connections_.size(); }

 private:
  struct Reservation {
    std::vector<EntrySlot> slots;
    std::vector<shm::EntryHeader> headers;  // as written; checked again at seal
  };
  struct Connection {
    uint32_t peer_pid = 0;
    bool greeted = false;
    NamespaceIndex ns = 0;
    std::unordered_map<uint64_t, std::vector<EntrySlot>> leases;
    std::map<uint64_t, Reservation> reservations;
  };

  Connection* greeted(ConnectionId id);
  ReuseKind reuse_kind_of(const Entry& e, uint64_t session_id) const;
  shm::EntryHeader make_entry_header(const Entry& e, uint32_t token_count,
                                     uint64_t payload_bytes) const;
  void drop_reservation(Reservation& r);
  void drop_lease(std::vector<EntrySlot>& slots);

  ParkOptions options_;
  EntryTable& table_;
  std::unordered_map<ConnectionId, Connection> connections_;
  uint64_t next_lease_id_ = 1;
  uint64_t next_reservation_id_ = 1;
  uint64_t leases_open_ = 0;
  uint64_t reservations_open_ = 0;
  uint64_t low_water_bytes_ = 0;
  Counters counters_;
};

}  // namespace kvpark::daemon
