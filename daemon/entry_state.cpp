// The entry table's records in the state segment (see entry_state.h).
#include "daemon/entry_state.h"

#include <algorithm>
#include <cassert>
#include <iterator>

#include "daemon/entry.h"
#include "proto/xxh3.h"

namespace kvpark::daemon {

uint64_t record_tail_digest(std::span<const int32_t> tail_tokens) {
  return tail_tokens.empty() ? 0 : XXH3_64bits(tail_tokens.data(), tail_tokens.size_bytes());
}

EntryState::EntryState(shm::StateSegment& segment)
    : segment_(segment),
      next_fresh_(segment.records_high_water()),
      connection_used_(segment.connection_capacity(), false) {}

uint32_t EntryState::allocate() {
  if (!free_.empty()) {
    const uint32_t index = free_.top();
    free_.pop();
    return index;
  }
  // Capacity is the most host entries the arena can hold (state_record_capacity_for).
  assert(next_fresh_ < segment_.record_capacity());
  return static_cast<uint32_t>(next_fresh_++);
}

namespace {

shm::StateRecordBody record_body(const Entry& e, const NamespaceInfo& ns) {
  shm::StateRecordBody body{};
  body.namespace_id = ns.id;
  body.key_hash = e.key_hash;
  body.parent_hash = e.parent_hash;
  body.extent_offset = e.extent_offset;
  body.extent_bytes = e.extent_bytes;
  body.payload_checksum = e.payload_checksum;
  body.creator_session = e.creator_session;
  body.tail_digest = record_tail_digest(e.tail_tokens);
  body.position = e.position;
  body.anchor_chunks = e.anchor_chunks;
  body.tail_tokens = static_cast<uint32_t>(e.tail_tokens.size());
  body.kind = static_cast<uint8_t>(e.kind);
  body.entry_class = static_cast<uint8_t>(e.entry_class);
  body.evidence = static_cast<uint8_t>(e.evidence);
  return body;
}

}  // namespace

uint32_t EntryState::write(const Entry& e, const NamespaceInfo& ns) {
  assert(e.sealed && e.on_host);
  const uint32_t index = e.state_record != no_record ? e.state_record : allocate();
  segment_.write_record(index, record_body(e, ns), e.hits, e.last_use_usec);
  if (e.pinned) upgrade(index, e);
  return index;
}

uint32_t EntryState::write_reservation(const Entry& e, const NamespaceInfo& ns) {
  assert(!e.sealed && e.on_host && e.state_record == no_record);
  const uint32_t index = allocate();
  segment_.write_reservation(index, record_body(e, ns));
  return index;
}

void EntryState::clear(uint32_t record) {
  segment_.clear_record(record);
  free_.push(record);
}

void EntryState::end_reservation(uint32_t record) {
  if (!frozen_) clear(record);
}

void EntryState::upgrade(uint32_t record, const Entry& e) {
  segment_.write_upgrade(record, static_cast<uint8_t>(e.entry_class),
                         static_cast<uint8_t>(e.evidence), e.pinned);
}

void EntryState::use(uint32_t record, const Entry& e) {
  segment_.write_use(record, e.hits, e.last_use_usec);
}

void EntryState::write_namespace(uint32_t index, const NamespaceInfo& ns) {
  shm::NamespaceRecord r{};
  r.id = ns.id;
  r.block_payload_bytes = ns.geometry.block_payload_bytes;
  r.block_tokens = ns.geometry.block_tokens;
  r.snapshot_required = ns.geometry.snapshot_required ? 1 : 0;
  r.prefill_tokens_per_second = ns.prefill_tokens_per_second;
  shm::NamespaceRecord kept{};
  // Unchanged records are left alone: a rewrite is a moment without a valid record.
  if (segment_.namespace_valid(index, kept) && kept.id == r.id &&
      kept.block_payload_bytes == r.block_payload_bytes && kept.block_tokens == r.block_tokens &&
      kept.snapshot_required == r.snapshot_required &&
      kept.prefill_tokens_per_second == r.prefill_tokens_per_second) {
    return;
  }
  segment_.write_namespace(index, r);
}

void EntryState::finish_adoption(uint32_t namespaces) {
  claimed_.resize((next_fresh_ + 63) / 64);  // nothing claimed: all zero
  for (uint32_t record : dropped_) {
    segment_.clear_record(record);  // never read again
    // A record claimed, then refused at the end, is free.
    claimed_[record / 64] &= ~(uint64_t{1} << (record % 64));
  }
  dropped_ = {};
  // Ascending indexes already form a valid min-heap.
  std::vector<uint32_t> free_records;
  for (uint64_t word = 0; word < claimed_.size(); ++word) {
    if (claimed_[word] == ~uint64_t{0}) continue;
    for (uint64_t i = word * 64; i < std::min(next_fresh_, (word + 1) * 64); ++i)
      if ((claimed_[word] >> (i % 64) & 1) == 0) free_records.push_back(static_cast<uint32_t>(i));
  }
  free_ = decltype(free_)(std::greater<>(), std::move(free_records));
  claimed_ = {};
  for (uint32_t i = namespaces; i < limits::namespaces_max; ++i) segment_.clear_namespace(i);
}

void EntryState::adopt_free_records(std::vector<uint32_t> free_records) {
  assert(std::is_sorted(free_records.begin(), free_records.end()));
  free_ = decltype(free_)(std::greater<>(), std::move(free_records));  // ascending: a min-heap
}

std::vector<uint32_t> EntryState::take_previous_connections() {
  std::vector<uint32_t> pids;
  for (uint32_t slot = 0; slot < segment_.connection_capacity(); ++slot) {
    const uint32_t pid = segment_.connection_pid(slot);
    if (pid == 0) {
      segment_.clear_connection(slot);  // garbage is no connection
      continue;
    }
    connection_used_[slot] = true;
    previous_slots_.push_back(slot);
    pids.push_back(pid);
  }
  return pids;
}

void EntryState::release_previous_connections() {
  for (uint32_t slot : previous_slots_) {
    connection_used_[slot] = false;
    segment_.clear_connection(slot);
  }
  previous_slots_.clear();
}

uint32_t EntryState::add_connection(uint32_t pid) {
  if (pid == 0) return no_record;
  auto it = std::find(connection_used_.begin(), connection_used_.end(), false);
  if (it == connection_used_.end()) return no_record;
  *it = true;
  const auto slot = static_cast<uint32_t>(it - connection_used_.begin());
  segment_.set_connection(slot, pid);
  return slot;
}

void EntryState::remove_connection(uint32_t slot) {
  if (slot == no_record || slot >= connection_used_.size()) return;
  connection_used_[slot] = false;
  if (!frozen_) segment_.clear_connection(slot);
}

}  // namespace kvpark::daemon
