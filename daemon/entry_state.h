// What the entry table keeps in the state segment (shm/state_format.h) so that a
// restarted daemon can adopt the arena: one record per sealed host entry and per
// reserved extent, one per namespace, one word per connected engine.
//
// The entry table calls it as entries change placement: a reservation record is
// written when an extent is reserved for an engine to write into, and rewritten in
// place as the entry's record when it is sealed; a record is written when an entry
// becomes readable on the host (a finished promotion); each is cleared before its
// extent is freed (abort, eviction, erase, a dead entry), so a record never names an
// extent something else may be written into. Record indexes are reused lowest first,
// keeping the touched part of the segment small. Loop thread only.
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <queue>
#include <span>
#include <vector>

#include "daemon/entry.h"
#include "shm/state_segment.h"

namespace kvpark::daemon {


class EntryState {
 public:
  explicit EntryState(shm::StateSegment& segment);

  // A record for a sealed host entry: its reservation record rewritten in place, or a
  // new one. Returns its index.
  uint32_t write(const Entry& e, const NamespaceInfo& ns);
  // A record for a reserved extent; returns its index.
  uint32_t write_reservation(const Entry& e, const NamespaceInfo& ns);
  void clear(uint32_t record);
  // A reservation ended unsealed. After freeze() its record stays: the engine may be
  // writing into the extent still, so the next instance holds it too.
  void end_reservation(uint32_t record);
  void upgrade(uint32_t record, const Entry& e);  // class, evidence, pin changed
  void use(uint32_t record, const Entry& e);      // hits and last use changed
  void write_namespace(uint32_t index, const NamespaceInfo& ns);

  // Adoption: `record` is an adopted entry's (claim) or a written record adoption
  // refused (drop: cleared at finish_adoption), claimed before or not. Every index below the
  // high-water mark not claimed is free once finish_adoption() runs; indexes neither claimed nor
  // dropped are already empty and are not touched.
  void claim(uint32_t record) {
    assert(record < next_fresh_);
    if (claimed_.empty()) claimed_.resize((next_fresh_ + 63) / 64);
    claimed_[record / 64] |= uint64_t{1} << (record % 64);
  }
  void drop(uint32_t record) { dropped_.push_back(record); }
  void finish_adoption(uint32_t namespaces);
  // Adoption of an index image (index_image.h): every record below the high-water mark
  // is an adopted entry's but `free_records` (ascending, each empty).
  void adopt_free_records(std::vector<uint32_t> free_records);

  // Connected engines (a connection slot is the daemon's own numbering).
  uint32_t add_connection(uint32_t pid);  // a slot, or no_record when full
  void remove_connection(uint32_t slot);
  // Adoption: the pids the previous instance had connected. Their words stay (a
  // second crash still knows them) until release_previous_connections().
  std::vector<uint32_t> take_previous_connections();
  void release_previous_connections();
  // A planned stop keeps the connection words and reservation records: engines may
  // still be copying out of their leases or into their reservations.
  void freeze() { frozen_ = true; }

  shm::StateSegment& segment() { return segment_; }
  const shm::StateSegment& segment() const { return segment_; }

 private:
  uint32_t allocate();

  shm::StateSegment& segment_;
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<>> free_;
  uint64_t next_fresh_ = 0;
  // Adoption's claims, a bit per record below the high-water mark: a list of 1M
  // indexes was 4 MiB of fresh pages, and page faults are much of adoption's time.
  std::vector<uint64_t> claimed_;
  std::vector<uint32_t> dropped_;
  std::vector<bool> connection_used_;
  std::vector<uint32_t> previous_slots_;
  bool frozen_ = false;
};

// XXH3-64 of a snapshot's tail token ids (what a record and the arena must agree on).
uint64_t record_tail_digest(std::span<const int32_t> tail_tokens);

}  // namespace kvpark::daemon
