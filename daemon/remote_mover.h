// The remote tier's traffic, shaped like the disk's (disk_mover.h): it writes sealed
// entries behind to the store, asks the store for what a lookup is missing (the chain
// past the blocks here, or the snapshots that continue it), fetches what the store has
// into the arena for the remote pseudo-connection, and settles the tier's completions.
// Park calls in where it calls the DiskMover: LOOKUP, SEAL, tick and completions. The
// leases stay Park's; the mover reaches them through RemoteLeases. Without a remote
// tier everything is a no-op. Loop thread only. See docs/remote.md.
//
// A fetch reserves each entry found in the arena for the remote pseudo-connection
// (remote_connection_id): other engines' lookups see it in flight (single flight),
// the lease that asked lists it as in flight, and it is sealed only once its bytes
// passed every check (remote_mover.cpp). A failure erases the reservation: a miss,
// never a wrong byte served.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <unordered_map>
#include <vector>

#include "daemon/counters.h"
#include "daemon/disk_mover.h"
#include "daemon/entry_table.h"
#include "daemon/lease.h"
#include "proto/wire.h"
#include "shm/arena_format.h"

namespace kvpark::remote {
struct EntryKey;
struct ImageTarget;
struct ProbeResult;
}  // namespace kvpark::remote

namespace kvpark::daemon {

class RemoteTier;
struct RemoteCompletion;

struct RemoteMoverOptions {
  uint8_t* arena_data = nullptr;  // the daemon's mapping of the data region
  uint64_t incarnation = 0;       // stamped into fetched entries' headers
  RemoteTier* remote = nullptr;   // null: no remote tier
  // One reservation's extents, bytes: Park's limit, which an operator may change.
  const uint64_t* reservation_bytes_max = nullptr;
};

// What the mover reaches of Park's connections: a lease by its connection and id
// (nullptr: gone), and a connection's namespace (false: the connection is gone).
struct RemoteLeases {
  std::function<Lease*(ConnectionId, uint64_t)> find_lease;
  std::function<bool(ConnectionId, NamespaceIndex*)> connection_namespace;
};

class RemoteMover {
 public:
  RemoteMover(const RemoteMoverOptions& options, EntryTable& table, DiskMover& disk,
              Counters& counters, RemoteLeases leases);
  RemoteMover(const RemoteMover&) = delete;
  RemoteMover& operator=(const RemoteMover&) = delete;

  RemoteTier* tier() const { return remote_; }

  // After a SEAL: a sealed entry the write policy sends to the store is written
  // behind, pinned until the write completes.
  void write_behind(EntrySlot slot);
  // After a lookup's block walk: what the store should be asked for, the chain past
  // it or the snapshots that continue it; marks the lease pending (and in flight, so
  // the engine may WAIT) unless none.
  enum class Probe : uint8_t { none, blocks, snapshots };
  Probe should_probe(NamespaceIndex ns, const wire::LookupRequest& req, Lease& lease);
  void start_probe(Probe probe, ConnectionId id, uint64_t lease_id, NamespaceIndex ns,
                   const wire::LookupRequest& req, const Lease& lease);
  // On each tick: probes over their budget stop holding their leases (a miss).
  void expire_probes();
  // The tier's notify fd is readable: settles its completions. The caller answers the
  // WAITs they may have settled.
  void take_completions();
  // Whether a snapshot probe still names the namespace (it may not be reused).
  bool names_namespace(NamespaceIndex ns) const;

 private:
  void finish_probe(const RemoteCompletion& done);
  // Reserves, in chain order, the blocks a probe found (keys[i] with results[i]),
  // fetching each into an extent of the remote pseudo-connection, up to chain index
  // `limit` (exclusive); a block here already is followed. Returns the chain index
  // reached: blocks [0, reached) of the chain are here, sealed or in flight. Stops at
  // the first miss, foreign value or full arena. Without `fetch`, only says how far
  // the chain would reach.
  uint32_t promote_blocks(NamespaceIndex ns, std::span<const remote::EntryKey> keys,
                          std::span<const remote::ProbeResult> results, uint32_t limit,
                          bool fetch, Lease* lease);
  void finish_get(const RemoteCompletion& done);
  // Reserves `n` for the remote pseudo-connection, writes its header and pins it for
  // the worker to stream into; false when it is not placed (no room, or a page taken
  // away), with nothing left reserved.
  bool reserve_for_fetch(const NewEntry& n, uint32_t token_count, uint64_t payload_bytes,
                         EntrySlot* ret_slot, remote::ImageTarget* ret_target);
  Lease* find_lease(ConnectionId id, uint64_t lease_id);
  shm::EntryHeader header_for(const Entry& e, uint32_t token_count, uint64_t payload_bytes) const;

  // Snapshots (remote_mover_snapshots.cpp): in snapshot-only and hybrid namespaces,
  // and the tail snapshot past an attention-only chain's last whole block once its
  // blocks are here. A lookup reads the indexes of its anchors past the deepest
  // snapshot (or block) here, then the manifests of the deepest usable snapshots they
  // list (and, hybrid, of the blocks up to the deepest one's anchor that are not here),
  // then restores the first whole one it can anchor into an extent the remote
  // pseudo-connection reserves.
  struct SnapshotCandidate {
    Hash128 anchor;
    uint32_t anchor_chunks = 0;
    uint32_t position = 0;
    std::vector<int32_t> tail_tokens;  // from the index
  };
  struct SnapshotProbe {
    ConnectionId connection = 0;
    NamespaceIndex ns = 0;
    uint32_t prompt_tokens = 0;
    uint32_t chunks = 0;                // whole chunks of the prompt
    uint32_t local_depth = 0;           // the deepest snapshot (or block) the lookup found here
    std::vector<int32_t> tail_tokens;   // the prompt's tokens past its last whole chunk
    std::vector<uint32_t> anchors;      // anchor_chunks of each index asked, as asked
    std::vector<SnapshotCandidate> candidates;  // manifests asked, best first
    // Hybrid namespaces: the prompt's chunk hashes up to the deepest anchor asked, and
    // the chain index of the first block whose manifest was asked after the candidates'.
    std::vector<Hash128> chunk_hashes;
    uint32_t blocks_first = 0;
  };
  // How many of the chain's blocks from `first` on are sealed here, in a row.
  uint32_t sealed_blocks_from(NamespaceIndex ns, std::span<const Hash128> chunk_hashes,
                              uint32_t first) const;
  // The anchors (as anchor_chunks, deepest first) whose indexes a lookup should read;
  // returns the deepest position the lease restores (its snapshots' or, attention-only,
  // its blocks').
  uint32_t snapshot_anchors(NamespaceIndex ns, const wire::LookupRequest& req, const Lease& lease,
                            std::vector<uint32_t>& ret_anchors);
  bool should_probe_snapshots(NamespaceIndex ns, const wire::LookupRequest& req, Lease& lease);
  void start_snapshot_probe(ConnectionId id, uint64_t lease_id, NamespaceIndex ns,
                            const wire::LookupRequest& req, const Lease& lease);
  void finish_snapshot_index(const RemoteCompletion& done);
  void finish_snapshot_manifests(const RemoteCompletion& done);
  // The probe of lease_id is over: its lease (if any) stops waiting for it.
  void end_snapshot_probe(uint64_t lease_id);

  uint8_t* arena_data_;
  uint64_t incarnation_;
  RemoteTier* remote_;
  const uint64_t& reservation_bytes_max_;
  EntryTable& table_;
  DiskMover& disk_;
  Counters& counters_;
  RemoteLeases leases_;
  // Snapshot probes out, by lease id (one per lease at most).
  std::unordered_map<uint64_t, SnapshotProbe> snapshot_probes_;
};

}  // namespace kvpark::daemon
