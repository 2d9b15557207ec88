// The index image, in process over a real state segment and real kept memory: what a
// clean stop leaves, what the next instance adopts (every key found, free space as
// before, the table working on), and each refusal leaving the table empty for the
// rebuild from the records.
#include "daemon/index_image.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "daemon/clock.h"
#include "daemon/entry_header.h"
#include "daemon/entry_state.h"
#include "daemon/entry_table.h"
#include "daemon/kept_memory.h"
#include "proto/limits.h"
#include "shm/arena_format.h"
#include "shm/state_segment.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t granule = limits::extent_align_bytes;
constexpr uint64_t block_extent = 2 * granule;
// Past 2 MiB of slab and cells (arrays adopted in place) with small arrays beside them
// (copied into the image at the stop).
constexpr uint64_t blocks = 20'000;
constexpr uint64_t arena_bytes = (blocks + 64) * block_extent;
constexpr NamespaceId ns_id{0x1a6e, 3};
constexpr uint32_t block_tokens = 16;

Hash128 key(uint64_t i) {
  return {i * 0x9e3779b97f4a7c15ull + 1, i};
}

class IndexImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    void* data = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT_NE(data, MAP_FAILED);
    arena_ = static_cast<uint8_t*>(data);
    int err = 0;
    ASSERT_EQ(shm::StateSegment::create({.arena_identity = 11,
                                         .arena_data_bytes = arena_bytes,
                                         .configured_arena_bytes = arena_bytes},
                                        segment_, err),
              Status::Ok);
    ASSERT_EQ(KeptMemory::open(-1, false, memory_, err), Status::Ok);
    open_table();
    ASSERT_EQ(table_->register_namespace(
                  ns_id, {.block_tokens = block_tokens, .block_payload_bytes = 4096}, 0, ns_),
              Status::Ok);
  }
  void TearDown() override {
    table_.reset();
    use_kept_memory(nullptr);
    munmap(arena_, arena_bytes);
  }

  void open_table() {
    use_kept_memory(memory_.get());
    state_ = std::make_unique<EntryState>(*segment_);
    table_ = std::make_unique<EntryTable>(arena_bytes, granule);
    table_->set_state(state_.get());
  }

  EntrySlot park_block(uint64_t i, bool seal = true) { return park_block_in(ns_, i, seal); }
  EntrySlot park_block_in(NamespaceIndex ns, uint64_t i, bool seal = true) {
    NewEntry n{
        .ns = ns, .kind = EntryKind::Block, .key_hash = key(i), .extent_bytes = block_extent};
    EntrySlot slot = no_slot;
    EXPECT_EQ(table_->insert_reserved(n, slot), Status::Ok);
    if (seal) table_->seal(slot, i, coarse_monotonic_usec());
    return slot;
  }

  // A snapshot of `tail` anchored at key(i), with its header and tail in the arena.
  EntrySlot park_snapshot(uint64_t i, const std::vector<int32_t>& tail) {
    const uint64_t payload_bytes = 1024;
    const auto tokens = static_cast<uint32_t>(tail.size());
    NewEntry n{.ns = ns_,
               .kind = EntryKind::Snapshot,
               .key_hash = key(i),
               .tail_tokens = tail,
               .extent_bytes = shm::extent_bytes_for(tokens, payload_bytes),
               .position = 2 * block_tokens + tokens,
               .anchor_chunks = 2};
    EntrySlot slot = no_slot;
    EXPECT_EQ(table_->insert_reserved(n, slot), Status::Ok);
    const Entry& e = table_->entry(slot);
    const shm::EntryHeader h =
        make_entry_header(e, table_->namespace_info(ns_), tokens, payload_bytes, 11);
    std::memcpy(arena_ + e.extent_offset, &h, sizeof h);
    std::memcpy(arena_ + e.extent_offset + limits::entry_header_bytes, tail.data(),
                tail.size() * sizeof(int32_t));
    table_->seal(slot, 0, coarse_monotonic_usec());
    return slot;
  }

  // A clean stop and a start, as kvparkd makes them: the image written, every array
  // freed with its pages kept, the segment and memory adopted again by new objects.
  void stop() {
    std::string why_not;
    EXPECT_TRUE(write_index_image(*table_, *state_, *memory_, why_not)) << why_not;
    table_.reset();
    state_.reset();
  }
  void restart_objects() {
    use_kept_memory(nullptr);
    const int memory_fd = dup(memory_->fd());
    memory_.reset();
    int err = 0;
    ASSERT_EQ(KeptMemory::open(memory_fd, false, memory_, err), Status::Ok);
    std::unique_ptr<shm::StateSegment> kept;
    ASSERT_EQ(shm::StateSegment::adopt(dup(segment_->fd()), kept, err), Status::Ok);
    segment_ = std::move(kept);
    open_table();
  }
  bool adopt_image(std::string& ret_why_not) {
    report_ = {};
    return adopt_index_image(*memory_, *state_, arena_, arena_bytes, *table_, report_, ret_why_not);
  }

  // Writes over one byte of an image array, `at` bytes into it.
  void flip(const char* array, uint64_t at) {
    uint64_t offset = 0, used = 0;
    ASSERT_TRUE(find_index_image_array(*memory_, array, offset, used)) << array;
    ASSERT_LT(at, used);
    uint8_t byte = 0;
    ASSERT_EQ(pread(memory_->fd(), &byte, 1, static_cast<off_t>(offset + at)), 1);
    byte ^= 0x10;
    ASSERT_EQ(pwrite(memory_->fd(), &byte, 1, static_cast<off_t>(offset + at)), 1);
  }

  uint8_t* arena_ = nullptr;
  std::unique_ptr<shm::StateSegment> segment_;
  std::unique_ptr<KeptMemory> memory_;
  std::unique_ptr<EntryState> state_;
  std::unique_ptr<EntryTable> table_;
  NamespaceIndex ns_ = 0;
  AdoptionReport report_;
};

TEST_F(IndexImageTest, ACleanStopsIndexIsAdoptedWithEveryKeyAndTheSameFreeSpace) {
  for (uint64_t i = 0; i < blocks; ++i) park_block(i);
  for (uint64_t i = 0; i < blocks; i += 100) table_->erase(table_->find_block(ns_, key(i)));
  const EntrySlot snapshot = park_snapshot(blocks + 1, {5, 6, 7});
  const uint64_t snapshot_offset = table_->entry(snapshot).extent_offset;
  park_block(blocks + 2, false);  // a reservation in flight at the stop: held after it
  const uint64_t kept_entries = blocks - blocks / 100 + 1;
  const uint64_t free_before = table_->bytes_free();
  stop();
  restart_objects();

  std::string why_not;
  ASSERT_TRUE(adopt_image(why_not)) << why_not;
  EXPECT_TRUE(report_.index_image);
  EXPECT_EQ(report_.entries, kept_entries);
  EXPECT_EQ(report_.dropped_total(), 0u);
  EXPECT_EQ(report_.reservations, 1u);
  EXPECT_EQ(report_.reservation_bytes, block_extent);
  EXPECT_EQ(table_->held_reservations(), 1u);
  EXPECT_EQ(table_->slots_in_use(), kept_entries + 1);  // the reservation's, unindexed
  EXPECT_EQ(table_->blocks(), kept_entries - 1);
  EXPECT_EQ(table_->snapshots(), 1u);
  EXPECT_EQ(table_->bytes_free(), free_before);
  EXPECT_EQ(table_->held_bytes(), table_->data_bytes() - free_before);
  for (uint64_t i = 0; i < blocks; ++i) {
    const EntrySlot slot = table_->find_block(ns_, key(i));
    if (i % 100 == 0) {
      EXPECT_EQ(slot, no_slot) << i;
      continue;
    }
    ASSERT_NE(slot, no_slot) << i;
    const Entry& e = table_->entry(slot);
    EXPECT_TRUE(e.sealed && e.on_host && e.adoption_hold && e.leases == 0) << i;
    EXPECT_EQ(e.payload_checksum, i);
  }
  EXPECT_EQ(table_->find_block(ns_, key(blocks + 2)), no_slot);
  const std::vector<int32_t> tail = {5, 6, 7};
  const EntrySlot found = table_->find_snapshot(ns_, key(blocks + 1), tail);
  ASSERT_NE(found, no_slot);
  EXPECT_EQ(table_->entry(found).extent_offset, snapshot_offset);

  // The adopted table works on: new entries, a freed hold, eviction, another stop.
  park_block(blocks + 3);
  EXPECT_NE(table_->find_block(ns_, key(blocks + 3)), no_slot);
  const uint64_t free_held = table_->bytes_free();
  table_->release_adoption_hold();
  EXPECT_EQ(table_->bytes_free(), free_held + block_extent);  // the reservation's extent
  EXPECT_EQ(table_->held_reservations(), 0u);
  EXPECT_EQ(table_->evictable_bytes(), table_->data_bytes() - table_->bytes_free());
  EXPECT_TRUE(table_->evict_lru());
  stop();
  restart_objects();
  ASSERT_TRUE(adopt_image(why_not)) << why_not;
  EXPECT_EQ(report_.entries, kept_entries);  // one parked, one evicted
}

// The adopted table knows which namespaces hold entries: when the namespace table is
// full, a new namespace takes the index of the one that holds none, never that of ns_.
TEST_F(IndexImageTest, AnAdoptedImagesNamespacesAreHeldByTheirEntries) {
  for (uint64_t i = 0; i < 100; ++i) park_block(i);
  NamespaceIndex empty = 0;
  const Geometry g{.block_tokens = block_tokens, .block_payload_bytes = 4096};
  ASSERT_EQ(table_->register_namespace({0xe, 0xe}, g, 0, empty), Status::Ok);
  stop();
  restart_objects();
  std::string why_not;
  ASSERT_TRUE(adopt_image(why_not)) << why_not;
  for (uint64_t i = table_->namespace_count(); i < limits::namespaces_max; ++i) {
    NamespaceIndex ns = 0;
    ASSERT_EQ(table_->register_namespace({0xf00 + i, 1}, g, 0, ns), Status::Ok);
    park_block_in(ns, i);  // each holds an entry
  }
  NamespaceIndex fresh = 0;
  ASSERT_EQ(
      table_->register_namespace({0xf, 0xf}, g, 0, fresh, [](NamespaceIndex) { return false; }),
      Status::Ok);
  EXPECT_EQ(fresh, empty);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_NE(table_->find_block(ns_, key(i)), no_slot) << i;
}

TEST_F(IndexImageTest, ACellWrittenOverFailsItsChecksumAndLeavesTheTableToTheRebuild) {
  for (uint64_t i = 0; i < blocks; ++i) park_block(i);
  stop();
  restart_objects();
  flip("cells", 12345);
  std::string why_not;
  EXPECT_FALSE(adopt_image(why_not));
  EXPECT_EQ(why_not, "its arrays fail their checksums");
  EXPECT_EQ(table_->slots_in_use(), 0u);
  // Refused, it is gone: nothing offered at the next start.
  EXPECT_FALSE(adopt_image(why_not));
  EXPECT_TRUE(why_not.empty());
  const AdoptionReport rebuilt = adopt_entries(*state_, arena_, arena_bytes, *table_);
  EXPECT_EQ(rebuilt.entries, blocks);
  EXPECT_NE(table_->find_block(ns_, key(7)), no_slot);
}

TEST_F(IndexImageTest, AnEntryThatDiffersFromItsRecordRefusesTheImage) {
  for (uint64_t i = 0; i < blocks; ++i) park_block(i);
  stop();
  restart_objects();
  flip("slots", 300 * sizeof(Entry) + offsetof(Entry, extent_offset) + 2);
  std::string why_not;
  EXPECT_FALSE(adopt_image(why_not));
  EXPECT_EQ(why_not, "an entry differs from its state record");
  EXPECT_EQ(table_->slots_in_use(), 0u);
  EXPECT_EQ(adopt_entries(*state_, arena_, arena_bytes, *table_).entries, blocks);
}

TEST_F(IndexImageTest, AnImageFromAnotherStateIsRefused) {
  for (uint64_t i = 0; i < 100; ++i) park_block(i);
  stop();
  restart_objects();
  // The records changed after the stop (as a later instance that crashed would leave
  // them): one more record than the image was written over.
  shm::StateRecordBody body{};
  body.namespace_id = ns_id;
  body.key_hash = key(5000);
  body.extent_offset = arena_bytes - block_extent;
  body.extent_bytes = block_extent;
  body.kind = static_cast<uint8_t>(EntryKind::Block);
  segment_->write_record(segment_->records_high_water(), body, 1, 0);
  std::string why_not;
  EXPECT_FALSE(adopt_image(why_not));
  EXPECT_EQ(why_not, "it describes another arena or state");
}

TEST_F(IndexImageTest, IoInFlightAtTheStopLeavesNoImage) {
  const EntrySlot slot = park_block(1);
  table_->pin_io(slot);
  std::string why_not;
  EXPECT_FALSE(write_index_image(*table_, *state_, *memory_, why_not));
  EXPECT_EQ(why_not, "disk I/O was still in flight");
  table_.reset();
  state_.reset();
  restart_objects();
  EXPECT_FALSE(adopt_image(why_not));
  EXPECT_TRUE(why_not.empty());
}

}  // namespace
}  // namespace kvpark::daemon
