// The index a clean stop leaves in the kept memory, and its adoption (see index_image.h).
#include "daemon/index_image.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstring>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "daemon/clock.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/kept_memory.h"
#include "proto/limits.h"
#include "proto/version.h"
#include "proto/xxh3.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t image_valid = 0x316e676d696b766bull;  // "kvkimgn1"
constexpr uint64_t page_bytes = 4096;

// One array of the image, in the kept memory.
struct ImageArray {
  uint64_t offset = 0;     // of its mapping in the memfd
  uint64_t map_bytes = 0;  // the mapping (whole units); 0: the array was empty
  uint64_t size = 0;       // elements
  uint64_t capacity = 0;   // elements it had room for (its mapping's, when in place)
  uint64_t checksum = 0;   // XXH3-64 of its `size` elements
};

struct ImageBody {
  uint32_t format_version = 0;
  uint32_t namespace_count = 0;
  uint64_t layout = 0;  // layout_fingerprint()
  uint64_t arena_identity = 0;
  uint64_t arena_data_bytes = 0;
  uint64_t records_high_water = 0;
  uint64_t entries = 0;  // in use; each has a valid record
  ImageArray slots, generations, free_slots, cells, record_slots;
  uint64_t cells_mask = 0, cells_size = 0, seed_low = 0, seed_high = 0;
  uint64_t tick = 0, sealed_blocks = 0, sealed_snapshots = 0, pinned = 0, held_bytes = 0;
  NamespaceInfo namespaces[limits::namespaces_max];
};

struct ImageHeader {
  uint64_t valid;     // image_valid, written last; cleared by the instance that reads it
  uint64_t checksum;  // XXH3-64 of body
  ImageBody body;
};
static_assert(sizeof(ImageHeader) <= kept_memory_header_bytes);
static_assert(std::is_trivially_copyable_v<NamespaceInfo> &&
              std::is_trivially_copyable_v<ImageBody>);

// What the image's bytes mean: a build whose entries, cells or namespaces are laid out
// differently (or of another release) rebuilds instead.
uint64_t layout_fingerprint() {
  const uint64_t layout[] = {index_image_format_version,
                             sizeof(Entry),
                             offsetof(Entry, key_hash),
                             offsetof(Entry, extent_offset),
                             offsetof(Entry, extent_bytes),
                             offsetof(Entry, tail_tokens),
                             offsetof(Entry, ns),
                             offsetof(Entry, state_record),
                             offsetof(Entry, kind),
                             offsetof(Entry, in_use),
                             offsetof(Entry, parent_hash),
                             offsetof(Entry, disk_bytes),
                             offsetof(Entry, creator_session),
                             offsetof(Entry, payload_checksum),
                             offsetof(Entry, hits),
                             offsetof(Entry, last_use_tick),
                             offsetof(Entry, last_use_usec),
                             offsetof(Entry, position),
                             offsetof(Entry, anchor_chunks),
                             offsetof(Entry, leases),
                             offsetof(Entry, io_pins),
                             offsetof(Entry, disk_dependents),
                             offsetof(Entry, disk_predecessor_id),
                             offsetof(Entry, reserved_by),
                             offsetof(Entry, lru_prev),
                             offsetof(Entry, disk_next),
                             offsetof(Entry, entry_class),
                             offsetof(Entry, evidence),
                             offsetof(Entry, sealed),
                             offsetof(Entry, adoption_hold),
                             BlockIndex::cell_bytes,
                             sizeof(NamespaceInfo),
                             sizeof(ImageBody)};
  return XXH3_64bits(layout, sizeof layout) ^ XXH3_64bits(version, std::strlen(version));
}

uint64_t round_up(uint64_t bytes, uint64_t unit) {
  return (bytes + unit - 1) / unit * unit;
}

}  // namespace

// The table's and block index's friend: what an image holds is their private state.
struct IndexImage {
  // Leaves the table as adoption of its own records would build it; the entries that
  // leave it (reservations, dead and disk-only entries) are taken out. Fills
  // record_slots (record index -> slot) and the counts in `body`.
  static bool normalize(EntryTable& t, uint64_t records_high_water,
                        HugePageVector<EntrySlot>& record_slots, ImageBody& body,
                        std::string& ret_why_not);
  // Places one array in the kept memory: in place when it is a kept mapping, else
  // copied into a range of its own (copies, to unmap at the end, in ret_copies).
  template <typename T>
  static bool place(KeptMemory& memory, const HugePageVector<T>& v, ImageArray& ret,
                    std::vector<void*>& ret_copies);
  // Maps an array's range for checking; nullptr (and map_bytes 0) for an empty one.
  static bool map(KeptMemory& memory, const ImageArray& a, size_t element_bytes, void*& ret_p);
  // Gives the vector the mapped array: in place (the mapping becomes its storage) or,
  // for an array operator new serves, copied.
  template <typename T>
  static void install(KeptMemory& memory, const ImageArray& a, void* p, HugePageVector<T>& v);
  static bool write(EntryTable& table, const EntryState& state, KeptMemory& memory,
                    std::string& ret_why_not);
  static bool adopt(KeptMemory& memory, EntryState& state, const uint8_t* arena_data,
                    uint64_t arena_bytes, EntryTable& table, AdoptionReport& report,
                    std::string& ret_why_not);
};

bool IndexImage::normalize(EntryTable& t, uint64_t records_high_water,
                           HugePageVector<EntrySlot>& record_slots, ImageBody& body,
                           std::string& ret_why_not) {
  if (t.adoption_claims_) {
    ret_why_not = "an adoption was still under way";
    return false;
  }
  for (const Entry& e : t.slots_) {
    if (e.in_use && (e.io_pins > 0 || e.promoting)) {
      ret_why_not = "disk I/O was still in flight";
      return false;
    }
  }
  record_slots.assign(records_high_water, no_slot);
  for (EntrySlot slot = 0; slot < t.slots_.size(); ++slot) {
    Entry& e = t.slots_[slot];
    if (!e.in_use) continue;
    const bool kept = e.sealed && !e.dead && e.on_host && e.state_record != no_record &&
                      e.state_record < records_high_water;
    if (!kept) {
      // Adoption would not find it: no record names it. Its extent is free then.
      if (!e.dead) t.remove_from_index(slot);
      EntryTable::set_tail(e, {});
      --t.namespace_slots_[e.ns];
      e = Entry{};
      ++t.generations_[slot];
      t.free_slots_.push_back(slot);
      --t.slots_in_use_;
      continue;
    }
    e.leases = 0;
    e.reserved_by = 0;
    e.on_disk = false;  // the disk tier's recovery attaches copies again
    e.disk_bytes = 0;
    e.disk_dependents = 0;
    e.disk_predecessor_id = no_entry_id;
    e.lru_prev = e.lru_next = e.disk_prev = e.disk_next = no_slot;
    e.on_lru = e.on_disk_lru = false;
    e.adoption_hold = true;
    EntryTable::set_tail(e, {});  // read again from the arena at adoption
    record_slots[e.state_record] = slot;
  }
  // The counts, as adoption makes them: since-start counters from zero.
  for (NamespaceInfo& info : t.namespaces_) {
    info.blocks = info.snapshots = info.bytes = info.disk_bytes = info.indexed_snapshots = 0;
    info.restorable_tokens = info.restored_tokens = 0;
  }
  for (const Entry& e : t.slots_) {
    if (!e.in_use) continue;
    NamespaceInfo& info = t.namespaces_[e.ns];
    info.bytes += e.extent_bytes;
    if (e.kind == EntryKind::Block) {
      ++info.blocks;
      ++body.sealed_blocks;
    } else {
      ++info.snapshots;
      ++info.indexed_snapshots;
      ++body.sealed_snapshots;
    }
    if (e.pinned) ++body.pinned;
    body.held_bytes += e.extent_bytes;
    ++body.entries;
  }
  return true;
}

template <typename T>
bool IndexImage::place(KeptMemory& memory, const HugePageVector<T>& v, ImageArray& ret,
                       std::vector<void*>& ret_copies) {
  ret = {.size = v.size(), .capacity = v.capacity()};
  if (v.empty()) return true;
  const uint64_t used = v.size() * sizeof(T);
  ret.checksum = XXH3_64bits(v.data(), used);
  if (v.capacity() * sizeof(T) >= huge_allocation_bytes_min &&
      memory.find_mapping(v.data(), ret.offset, ret.map_bytes)) {
    return true;
  }
  // Served by operator new (small) or anonymous memory (the kept memory had no room).
  void* copy = memory.map(v.capacity() * sizeof(T));
  if (copy == nullptr) return false;
  ret_copies.push_back(copy);
  std::memcpy(copy, v.data(), used);
  return memory.find_mapping(copy, ret.offset, ret.map_bytes);
}

bool IndexImage::map(KeptMemory& memory, const ImageArray& a, size_t element_bytes, void*& ret_p) {
  ret_p = nullptr;
  if (a.size == 0) return true;
  if (a.size > a.capacity || a.capacity > a.map_bytes / element_bytes) return false;
  ret_p = memory.map_range(a.offset, a.map_bytes, round_up(a.size * element_bytes, page_bytes));
  return ret_p != nullptr;
}

template <typename T>
void IndexImage::install(KeptMemory& memory, const ImageArray& a, void* p, HugePageVector<T>& v) {
  v = {};
  if (p == nullptr) return;
  if (a.capacity * sizeof(T) >= huge_allocation_bytes_min &&
      round_up(a.capacity * sizeof(T), kept_memory_unit_bytes) == a.map_bytes) {
    memory.serve_next_map(p);  // the allocation reserve() makes
    keep_contents_on_resize = true;
    v.reserve(a.capacity);
    v.resize(a.size);
    keep_contents_on_resize = false;
    return;
  }
  v.resize(a.size);
  std::memcpy(static_cast<void*>(v.data()), p, a.size * sizeof(T));
  memory.unmap_keeping_pages(p);
}

bool IndexImage::adopt(KeptMemory& memory, EntryState& state, const uint8_t* arena_data,
                       uint64_t arena_bytes, EntryTable& table, AdoptionReport& report,
                       std::string& ret_why_not) {
  const uint64_t start = monotonic_usec();
  ret_why_not.clear();
  auto* header = reinterpret_cast<ImageHeader*>(memory.header());
  const uint64_t valid = std::atomic_ref<uint64_t>(header->valid).load(std::memory_order_acquire);
  if (valid == 0) return false;  // none: a crash, a first start, or not written
  // Read once: whatever happens next, this image is never adopted again.
  std::atomic_ref<uint64_t>(header->valid).store(0, std::memory_order_release);
  const ImageBody& body = header->body;
  shm::StateSegment& segment = state.segment();
  auto refuse = [&](const char* why) {
    ret_why_not = why;
    return false;
  };
  if (valid != image_valid || header->checksum != XXH3_64bits(&body, sizeof body))
    return refuse("its header fails its check");
  if (body.format_version != index_image_format_version || body.layout != layout_fingerprint())
    return refuse("another build wrote it");
  if (body.arena_identity != segment.header().arena_identity ||
      body.arena_data_bytes != arena_bytes ||
      body.records_high_water != segment.records_high_water() ||
      body.namespace_count > limits::namespaces_max)
    return refuse("it describes another arena or state");
  assert(table.slots_in_use() == 0 && table.namespace_count() == 0);
  // Namespaces: record i is namespace i, as the image has it, and no more.
  std::unordered_map<NamespaceId, NamespaceIndex, Hash128Hasher> by_id;
  for (uint32_t i = 0; i < limits::namespaces_max; ++i) {
    shm::NamespaceRecord r{};
    const bool valid_record = segment.namespace_valid(i, r);
    if (i >= body.namespace_count) {
      if (valid_record) return refuse("its namespaces differ from the state's");
      continue;
    }
    const NamespaceInfo& info = body.namespaces[i];
    if (!valid_record || !(r.id == info.id) || r.block_tokens != info.geometry.block_tokens ||
        r.block_payload_bytes != info.geometry.block_payload_bytes ||
        (r.snapshot_required != 0) != info.geometry.snapshot_required ||
        r.prefill_tokens_per_second != info.prefill_tokens_per_second ||
        !by_id.emplace(info.id, i).second)
      return refuse("its namespaces differ from the state's");
  }

  void *slots_p = nullptr, *generations_p = nullptr, *free_p = nullptr, *cells_p = nullptr,
       *records_p = nullptr;
  auto unmap_all = [&] {
    for (void* p : {slots_p, generations_p, free_p, cells_p, records_p})
      if (p != nullptr) memory.unmap_keeping_pages(p);
  };
  if (!map(memory, body.slots, sizeof(Entry), slots_p) ||
      !map(memory, body.generations, sizeof(uint32_t), generations_p) ||
      !map(memory, body.free_slots, sizeof(EntrySlot), free_p) ||
      !map(memory, body.cells, BlockIndex::cell_bytes, cells_p) ||
      !map(memory, body.record_slots, sizeof(EntrySlot), records_p) ||
      body.record_slots.size != body.records_high_water ||
      body.generations.size != body.slots.size || body.entries > body.slots.size ||
      body.cells_mask + 1 != body.cells.size || (body.cells.size & body.cells_mask) != 0) {
    unmap_all();
    return refuse("its arrays are not where it says");
  }
  // The arrays no record vouches for are checked against the stop's checksums on a
  // second core while this one checks every record against its entry.
  std::atomic<bool> sums_match{false};
  auto check_sums = [&] {
    auto sum = [](const ImageArray& a, const void* p, size_t element_bytes) {
      return a.size == 0 || XXH3_64bits(p, a.size * element_bytes) == a.checksum;
    };
    sums_match = sum(body.slots, slots_p, sizeof(Entry)) &&
                 sum(body.generations, generations_p, sizeof(uint32_t)) &&
                 sum(body.free_slots, free_p, sizeof(EntrySlot)) &&
                 sum(body.cells, cells_p, BlockIndex::cell_bytes) &&
                 sum(body.record_slots, records_p, sizeof(EntrySlot));
  };
  std::thread summer;
  try {
    summer = std::thread(check_sums);
  } catch (const std::system_error&) {
    check_sums();
  }

  const auto* slots = static_cast<const Entry*>(slots_p);
  const auto* record_slots = static_cast<const EntrySlot*>(records_p);
  const shm::RecordsToAdopt adopting = segment.records_to_adopt();
  const std::span<const shm::StateRecord> records = adopting.records();
  shm::ExtentClaims claims(arena_bytes, limits::extent_align_bytes);
  std::vector<uint32_t> free_records;
  struct SnapshotTail {
    EntrySlot slot;
    std::vector<int32_t> tail;
  };
  std::vector<SnapshotTail> snapshots;
  struct HeldReservation {
    uint32_t record;
    NamespaceIndex ns;
  };
  std::vector<HeldReservation> reservations;
  std::vector<int32_t> tail;
  uint64_t entries = 0, bytes = 0, sequence = 0;
  NamespaceId last_id{};
  auto last_ns = by_id.end();
  const char* why = nullptr;
  for (uint64_t i = 0; i < records.size() && why == nullptr; ++i) {
    const shm::StateRecord& record = records[i];
    const auto check = shm::StateSegment::check(record);
    if (check == shm::StateSegment::RecordCheck::Empty) {
      if (record_slots[i] != no_slot) why = "a record its entries name is empty";
      free_records.push_back(static_cast<uint32_t>(i));
      continue;
    }
    if (check == shm::StateSegment::RecordCheck::Damaged) {
      why = "a state record fails its check";
      break;
    }
    const shm::StateRecordBody& b = record.body;
    if (last_ns == by_id.end() || !(b.namespace_id == last_id)) {
      last_ns = by_id.find(b.namespace_id);
      last_id = b.namespace_id;
    }
    if (check == shm::StateSegment::RecordCheck::Reservation) {
      // An engine may still be writing into it: held like the rebuild holds it (adoption.h).
      if (last_ns == by_id.end() || !extent_inside_arena(b, arena_bytes) ||
          record_slots[i] != no_slot) {
        why = "a reservation record would not be held";
      } else if (!claims.claim(b.extent_offset, b.extent_bytes)) {
        why = "two entries' extents overlap";
      } else {
        reservations.push_back({static_cast<uint32_t>(i), last_ns->second});
        sequence = std::max(sequence, b.sequence);
      }
      continue;
    }
    DropReason reason{};
    const EntrySlot slot = record_slots[i];
    if (last_ns == by_id.end() || !record_adoptable(b, body.namespaces[last_ns->second], arena_data,
                                                    arena_bytes, tail, reason)) {
      why = "a state record would not be adopted";
    } else if (slot >= body.slots.size || !slots[slot].in_use || slots[slot].state_record != i ||
               !(slots[slot].key_hash == b.key_hash) ||
               slots[slot].extent_offset != b.extent_offset ||
               slots[slot].extent_bytes != b.extent_bytes || slots[slot].ns != last_ns->second ||
               slots[slot].kind != static_cast<EntryKind>(b.kind) ||
               slots[slot].tail_tokens.data != nullptr || slots[slot].tail_tokens.count != 0) {
      why = "an entry differs from its state record";
    } else if (!claims.claim(b.extent_offset, b.extent_bytes)) {
      why = "two entries' extents overlap";
    } else {
      if (b.kind == static_cast<uint8_t>(EntryKind::Snapshot)) snapshots.push_back({slot, tail});
      ++entries;
      bytes += b.extent_bytes;
      sequence = std::max(sequence, b.sequence);
    }
  }
  if (why == nullptr && entries != body.entries) why = "it holds entries no state record names";
  if (summer.joinable()) summer.join();
  if (why == nullptr && !sums_match) why = "its arrays fail their checksums";
  if (why != nullptr) {
    unmap_all();
    return refuse(why);
  }

  // Checked: the arrays become the table's, in place.
  install(memory, body.slots, slots_p, table.slots_);
  install(memory, body.generations, generations_p, table.generations_);
  install(memory, body.free_slots, free_p, table.free_slots_);
  install(memory, body.cells, cells_p, table.blocks_.cells_);
  if (records_p != nullptr) memory.unmap_keeping_pages(records_p);
  BlockIndex& blocks = table.blocks_;
  blocks.mask_ = body.cells_mask;
  blocks.size_ = body.cells_size;
  blocks.seed_low_ = body.seed_low;
  blocks.seed_high_ = body.seed_high;
  table.namespaces_.assign(body.namespaces, body.namespaces + body.namespace_count);
  table.namespace_slots_.clear();
  for (NamespaceIndex i = 0; i < body.namespace_count; ++i) {
    table.namespace_by_id_.emplace(body.namespaces[i].id, i);
    // An image holds sealed host entries alone, each counted in its namespace.
    table.namespace_slots_.push_back(body.namespaces[i].blocks + body.namespaces[i].snapshots);
  }
  for (SnapshotTail& s : snapshots) {
    Entry& e = table.slots_[s.slot];
    EntryTable::set_tail(e, s.tail);
    table.snapshots_[{e.ns, e.key_hash}].push_back(s.slot);
  }
  table.tick_ = body.tick;
  table.sealed_blocks_ = body.sealed_blocks;
  table.sealed_snapshots_ = body.sealed_snapshots;
  table.pinned_ = body.pinned;
  table.held_bytes_ = body.held_bytes;
  table.slots_in_use_ = body.entries;
  uint64_t reservation_bytes = 0;
  for (const HeldReservation& r : reservations) {
    const shm::StateRecordBody& b = records[r.record].body;
    NewEntry n;
    n.ns = r.ns;
    n.kind = static_cast<EntryKind>(b.kind);
    n.key_hash = b.key_hash;
    n.extent_bytes = b.extent_bytes;
    (void)table.new_held_reservation(n, b.extent_offset, r.record);
    reservation_bytes += b.extent_bytes;
  }
  table.allocator_.adopt(claims);
  state.adopt_free_records(std::move(free_records));
  segment.note_sequence(sequence);

  report.adopted = true;
  report.index_image = true;
  report.entries = entries;
  report.bytes = bytes;
  report.reservations = reservations.size();
  report.reservation_bytes = reservation_bytes;
  report.previous_pids = state.take_previous_connections();
  report.usec = monotonic_usec() - start;
  return true;
}

bool write_index_image(EntryTable& table, const EntryState& state, KeptMemory& memory,
                       std::string& ret_why_not) {
  return IndexImage::write(table, state, memory, ret_why_not);
}

bool IndexImage::write(EntryTable& table, const EntryState& state, KeptMemory& memory,
                       std::string& ret_why_not) {
  auto* header = reinterpret_cast<ImageHeader*>(memory.header());
  std::atomic_ref<uint64_t>(header->valid).store(0, std::memory_order_release);
  // From here every array freed leaves its pages: the image's, and the process exits.
  memory.keep_pages();
  ImageBody& body = header->body;
  body = ImageBody{};
  const shm::StateSegment& segment = state.segment();
  HugePageVector<EntrySlot> record_slots;
  if (!IndexImage::normalize(table, segment.records_high_water(), record_slots, body,
                             ret_why_not)) {
    return false;
  }
  body.format_version = index_image_format_version;
  body.layout = layout_fingerprint();
  body.arena_identity = segment.header().arena_identity;
  body.arena_data_bytes = segment.header().arena_data_bytes;
  body.records_high_water = segment.records_high_water();
  std::vector<void*> copies;
  const bool placed = IndexImage::place(memory, table.slots_, body.slots, copies) &&
                      IndexImage::place(memory, table.generations_, body.generations, copies) &&
                      IndexImage::place(memory, table.free_slots_, body.free_slots, copies) &&
                      IndexImage::place(memory, table.blocks_.cells_, body.cells, copies) &&
                      IndexImage::place(memory, record_slots, body.record_slots, copies);
  for (void* copy : copies) memory.unmap_keeping_pages(copy);
  if (!placed) {
    ret_why_not = "the kept memory had no room for an array";
    return false;
  }
  const BlockIndex& blocks = table.blocks_;
  body.cells_mask = blocks.mask_;
  body.cells_size = blocks.size_;
  body.seed_low = blocks.seed_low_;
  body.seed_high = blocks.seed_high_;
  body.tick = table.tick_;
  body.namespace_count = static_cast<uint32_t>(table.namespaces_.size());
  std::copy(table.namespaces_.begin(), table.namespaces_.end(), body.namespaces);
  header->checksum = XXH3_64bits(&body, sizeof body);
  std::atomic_ref<uint64_t>(header->valid).store(image_valid, std::memory_order_release);
  return true;
}

bool find_index_image_array(const KeptMemory& memory, std::string_view name, uint64_t& ret_offset,
                            uint64_t& ret_used_bytes) {
  const auto* header = reinterpret_cast<const ImageHeader*>(memory.header());
  if (header->valid != image_valid) return false;
  const ImageBody& b = header->body;
  const struct {
    std::string_view name;
    const ImageArray& array;
    size_t element_bytes;
  } arrays[] = {{"slots", b.slots, sizeof(Entry)},
                {"generations", b.generations, sizeof(uint32_t)},
                {"free_slots", b.free_slots, sizeof(EntrySlot)},
                {"cells", b.cells, BlockIndex::cell_bytes},
                {"record_slots", b.record_slots, sizeof(EntrySlot)}};
  for (const auto& a : arrays) {
    if (a.name != name || a.array.map_bytes == 0) continue;
    ret_offset = a.array.offset;
    ret_used_bytes = a.array.size * a.element_bytes;
    return true;
  }
  return false;
}

void discard_index_image(KeptMemory& memory) {
  auto* header = reinterpret_cast<ImageHeader*>(memory.header());
  std::atomic_ref<uint64_t>(header->valid).store(0, std::memory_order_release);
}

bool adopt_index_image(KeptMemory& memory, EntryState& state, const uint8_t* arena_data,
                       uint64_t arena_bytes, EntryTable& table, AdoptionReport& report,
                       std::string& ret_why_not) {
  return IndexImage::adopt(memory, state, arena_data, arena_bytes, table, report, ret_why_not);
}

}  // namespace kvpark::daemon
