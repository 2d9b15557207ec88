// Taking over a kept arena and rebuilding the index from its state (see adoption.h).
#include "daemon/adoption.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <unordered_map>

#include "daemon/clock.h"
#include "daemon/config.h"
#include "daemon/entry_table.h"
#include "shm/arena_format.h"
#include "shm/arena_guard.h"

namespace kvpark::daemon {
namespace {

// Hits are an eviction hint; a scribbled count must not pin an entry forever.
constexpr uint64_t adopted_hits_max = uint64_t{1} << 32;

const char* huge_pages_name(uint32_t setting) {
  switch (static_cast<shm::HugePages>(setting)) {
    case shm::HugePages::Try:
      return "try";
    case shm::HugePages::On:
      return "on";
    case shm::HugePages::Off:
      return "off";
  }
  return "unknown";
}

std::string mib(uint64_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

}  // namespace

bool extent_inside_arena(const shm::StateRecordBody& b, uint64_t arena_bytes) {
  return b.extent_bytes != 0 && b.extent_offset % limits::extent_align_bytes == 0 &&
         b.extent_bytes % limits::extent_align_bytes == 0 && b.extent_offset <= arena_bytes &&
         b.extent_bytes <= arena_bytes - b.extent_offset;
}

const char* drop_reason_name(DropReason reason) {
  switch (reason) {
    case DropReason::Damaged:
      return "damaged";
    case DropReason::Namespace:
      return "namespace";
    case DropReason::Extent:
      return "extent";
    case DropReason::Header:
      return "header";
    case DropReason::Tail:
      return "tail";
  }
  return "unknown";
}

uint64_t AdoptionReport::dropped_total() const {
  uint64_t total = 0;
  for (uint64_t n : dropped) total += n;
  return total;
}

std::string AdoptionReport::summary() const {
  char head[160];
  std::snprintf(head, sizeof head,
                "adopted %llu entries (%.2f GiB) from the previous instance in %llu ms",
                static_cast<unsigned long long>(entries), static_cast<double>(bytes) / (1ull << 30),
                static_cast<unsigned long long>(usec / 1000));
  std::string text = head;
  if (index_image) text += ", its index kept";
  if (reservations > 0) {
    text += ", holding " + std::to_string(reservations) + " extents (" + mib(reservation_bytes) +
            ") reserved when it stopped";
  }
  text += "; dropped " + std::to_string(dropped_total());
  std::string why;
  for (size_t r = 0; r < drop_reason_count; ++r) {
    if (dropped[r] == 0) continue;
    why += (why.empty() ? "" : ", ") + std::to_string(dropped[r]) + " " +
           drop_reason_name(static_cast<DropReason>(r));
  }
  return why.empty() ? text : text + " (" + why + ")";
}

bool record_adoptable(const shm::StateRecordBody& b, const NamespaceInfo& info,
                      const uint8_t* arena_data, uint64_t arena_bytes,
                      std::vector<int32_t>& ret_tail, DropReason& ret_reason) {
  const bool block = b.kind == static_cast<uint8_t>(EntryKind::Block);
  const bool shape = (block ? info.geometry.block_tokens > 0 && b.tail_tokens == 0
                            : b.kind == static_cast<uint8_t>(EntryKind::Snapshot) &&
                                  b.tail_tokens < info.chain_tokens) &&
                     b.entry_class <= entry_class_max && b.evidence <= evidence_max;
  if (!shape || !extent_inside_arena(b, arena_bytes)) {
    ret_reason = DropReason::Extent;
    return false;
  }
  ret_tail.clear();
  if (block) return true;
  // A snapshot's extent is read for its tail tokens (the index needs them), and its
  // header must name the same entry. Blocks touch no arena page: a page fault per
  // entry would dominate adoption, and readers confirm headers and token ids anyway.
  // The tail is read from the extent: a record (checksummed, but not proof against
  // every scribble) whose tail would not fit in it is refused before any read.
  shm::EntryHeader h{};
  const uint32_t tokens = b.tail_tokens;
  const bool header_ok =
      shm::payload_offset_for(tokens) <= b.extent_bytes &&
      shm::guarded_copy(&h, arena_data + b.extent_offset, sizeof h) &&
      h.magic == shm::entry_magic && h.format_version == shm::entry_format_version &&
      h.kind == b.kind && h.namespace_id == b.namespace_id && h.key_hash == b.key_hash &&
      h.token_count == tokens && h.position == b.position && h.anchor_chunks == b.anchor_chunks &&
      h.payload_offset == shm::payload_offset_for(tokens) &&
      h.payload_bytes <= b.extent_bytes &&  // no wrap in the sum below
      shm::extent_bytes_for(tokens, h.payload_bytes) == b.extent_bytes;
  if (!header_ok) {
    ret_reason = DropReason::Header;
    return false;
  }
  ret_tail.assign(tokens, 0);
  if (!shm::guarded_copy(ret_tail.data(), arena_data + b.extent_offset + limits::entry_header_bytes,
                         ret_tail.size() * sizeof(int32_t)) ||
      record_tail_digest(ret_tail) != b.tail_digest) {
    ret_reason = DropReason::Tail;
    return false;
  }
  return true;
}

bool take_over(StoredFds& fds, const AdoptionConfig& config, KeptArena& ret_kept,
               std::string& ret_reason) {
  ret_reason.clear();
  if (!fds.any()) return false;
  if (!fds.complete()) {
    ret_reason = "the service manager kept only part of the arena";
    close_stored_fds(fds);
    return false;
  }
  int err = 0;
  std::unique_ptr<shm::ArenaOwner> arena;
  const Status arena_status = shm::ArenaOwner::adopt(fds.arena_header, fds.arena_data, arena, err);
  fds.arena_header = fds.arena_data = -1;  // taken
  std::unique_ptr<shm::StateSegment> state;
  const Status state_status = shm::StateSegment::adopt(fds.state, state, err);
  fds.state = -1;
  if (arena_status != Status::Ok) {
    ret_reason = "the kept arena is not a sealed arena of this format (arena format " +
                 std::to_string(shm::arena_format_version) + ")";
    return false;
  }
  if (state_status != Status::Ok) {
    ret_reason =
        "the kept state segment fails its header check or is of another format (state format " +
        std::to_string(shm::state_format_version) + ")";
    return false;
  }
  const shm::StateHeader& s = state->header();
  const shm::ArenaHeader& a = arena->header();
  if (s.arena_identity != a.incarnation || s.arena_data_bytes != a.data_bytes ||
      s.arena_format_version != shm::arena_format_version ||
      s.entry_format_version != shm::entry_format_version) {
    ret_reason = "the kept state segment describes another arena or entry format";
  } else if (s.configured_arena_bytes != config.configured_arena_bytes) {
    ret_reason = "the kept arena is " + mib(s.configured_arena_bytes) +
                 ", the configuration asks for " + mib(config.configured_arena_bytes);
  } else if (s.huge_pages != static_cast<uint16_t>(config.huge_pages)) {
    ret_reason = std::string("huge_pages was ") + huge_pages_name(s.huge_pages) + ", is now " +
                 huge_pages_name(static_cast<uint32_t>(config.huge_pages));
  }
  if (!ret_reason.empty()) return false;
  ret_kept.arena = std::move(arena);
  ret_kept.state = std::move(state);
  return true;
}

AdoptionReport adopt_entries(EntryState& state, const uint8_t* arena_data, uint64_t arena_bytes,
                             EntryTable& table) {
  const uint64_t start = monotonic_usec();
  AdoptionReport report;
  report.adopted = true;
  shm::StateSegment& segment = state.segment();
  // Every namespace record first: registering rewrites them in index order.
  std::vector<shm::NamespaceRecord> namespaces;
  for (uint32_t i = 0; i < limits::namespaces_max; ++i) {
    shm::NamespaceRecord r{};
    if (segment.namespace_valid(i, r)) namespaces.push_back(r);
  }
  std::unordered_map<NamespaceId, NamespaceIndex, Hash128Hasher> by_id;
  for (const shm::NamespaceRecord& r : namespaces) {
    const Geometry g{.block_tokens = r.block_tokens,
                     .block_payload_bytes = r.block_payload_bytes,
                     .snapshot_required = r.snapshot_required != 0};
    NamespaceIndex ns = 0;
    if (table.register_namespace(r.id, g, r.prefill_tokens_per_second, ns) == Status::Ok)
      by_id[r.id] = ns;
  }
  // Records come in runs of one namespace: the last one found answers most lookups.
  NamespaceId last_id{};
  auto last_ns = by_id.end();
  auto find_namespace = [&](const NamespaceId& id) {
    if (last_ns == by_id.end() || !(id == last_id)) {
      last_ns = by_id.find(id);
      last_id = id;
    }
    return last_ns;
  };
  const uint64_t now = coarse_monotonic_usec();
  std::vector<int32_t> tail;
  const shm::RecordsToAdopt adopting = segment.records_to_adopt();
  const std::span<const shm::StateRecord> records = adopting.records();
  table.begin_adoption(records.size());
  // One NewEntry, its fields set record by record: built afresh for each, it was zeroed
  // first with a `rep stos` whose start-up cost came to about 10 ms over 1M records.
  NewEntry n;
  for (uint64_t i = 0; i < records.size(); ++i) {
    const shm::StateRecord& record = records[i];  // nothing writes it during adoption
    const auto check = shm::StateSegment::check(record);
    if (check == shm::StateSegment::RecordCheck::Empty) continue;
    auto drop = [&](DropReason reason) {
      ++report.dropped[static_cast<size_t>(reason)];
      state.drop(static_cast<uint32_t>(i));
    };
    if (check == shm::StateSegment::RecordCheck::Damaged) {
      drop(DropReason::Damaged);
      continue;
    }
    const shm::StateRecordBody& b = record.body;
    const auto ns_it = find_namespace(b.namespace_id);
    if (ns_it == by_id.end()) {
      drop(DropReason::Namespace);
      continue;
    }
    if (check == shm::StateSegment::RecordCheck::Reservation) {
      // An engine may still be writing into it: held, never indexed.
      if (!extent_inside_arena(b, arena_bytes)) {
        drop(DropReason::Extent);
        continue;
      }
      n.ns = ns_it->second;
      n.kind = static_cast<EntryKind>(b.kind);
      n.key_hash = b.key_hash;
      n.parent_hash = b.parent_hash;
      n.tail_tokens = {};
      n.extent_bytes = b.extent_bytes;
      EntrySlot slot = no_slot;
      (void)table.insert_adopted_reservation(n, b.extent_offset, static_cast<uint32_t>(i), slot);
      state.claim(static_cast<uint32_t>(i));
      segment.note_sequence(b.sequence);
      ++report.reservations;
      report.reservation_bytes += b.extent_bytes;
      continue;
    }
    DropReason reason = DropReason::Extent;
    if (!record_adoptable(b, table.namespace_info(ns_it->second), arena_data, arena_bytes, tail,
                          reason)) {
      drop(reason);
      continue;
    }
    uint8_t entry_class = 0, evidence = 0;
    bool pinned = false;
    shm::StateSegment::upgraded(record, entry_class, evidence, pinned);
    if (entry_class > entry_class_max || evidence > evidence_max) {
      entry_class = b.entry_class;
      evidence = b.evidence;
      pinned = false;
    }
    n.ns = ns_it->second;
    n.kind = static_cast<EntryKind>(b.kind);
    n.key_hash = b.key_hash;
    n.parent_hash = b.parent_hash;
    n.tail_tokens = tail;
    n.extent_bytes = b.extent_bytes;
    n.position = b.position;
    n.anchor_chunks = b.anchor_chunks;
    n.creator_session = b.creator_session;
    n.payload_checksum = b.payload_checksum;
    n.entry_class = static_cast<EntryClass>(entry_class);
    n.evidence = static_cast<Evidence>(evidence);
    EntrySlot slot = no_slot;
    if (table.insert_adopted(n, b.extent_offset, static_cast<uint32_t>(i),
                             std::min(record.hits, adopted_hits_max),
                             std::min(record.last_use_usec, now), pinned, slot) != Status::Ok) {
      drop(DropReason::Extent);
      continue;
    }
    state.claim(static_cast<uint32_t>(i));
    segment.note_sequence(b.sequence);
    ++report.entries;
    report.bytes += b.extent_bytes;
  }
  // Blocks refused as the index is built: a key an earlier record holds, or an extent
  // an earlier record took.
  const EntryTable::Refused refused = table.finish_adoption();
  for (const uint32_t record : refused.records) state.drop(record);
  report.entries -= refused.records.size();
  report.bytes -= refused.bytes;
  report.dropped[static_cast<size_t>(DropReason::Extent)] += refused.records.size();
  for (const uint32_t record : refused.reservation_records) {
    state.drop(record);
    report.reservation_bytes -= records[record].body.extent_bytes;
  }
  report.reservations -= refused.reservation_records.size();
  report.dropped[static_cast<size_t>(DropReason::Extent)] += refused.reservation_records.size();
  state.finish_adoption(static_cast<uint32_t>(table.namespace_count()));
  report.previous_pids = state.take_previous_connections();
  report.usec = monotonic_usec() - start;
  return report;
}

}  // namespace kvpark::daemon
