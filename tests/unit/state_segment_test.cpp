// The state segment's record discipline (shm/state_format.h): a record is empty,
// whole and valid, or recognisably damaged, whatever byte of it was written over; the
// upgrade word falls back to the values at seal when its check fails; the header of a
// segment made for another format or size is refused at adoption.
#include "shm/state_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#include "proto/xxh3.h"
#include "shm/arena.h"
#include "shm/mapping.h"
#include "tests/testing/huge_pages.h"
#include "tests/testing/huge_tmpfs.h"
#include "tests/testing/smaps.h"

namespace kvpark::shm {
namespace {

constexpr uint64_t arena_bytes = 16ull << 20;

std::unique_ptr<StateSegment> make_segment() {
  std::unique_ptr<StateSegment> segment;
  int err = 0;
  EXPECT_EQ(StateSegment::create({.arena_identity = 42,
                                  .arena_data_bytes = arena_bytes,
                                  .configured_arena_bytes = arena_bytes},
                                 segment, err),
            Status::Ok);
  return segment;
}

StateRecordBody body_at(uint64_t offset) {
  StateRecordBody b{};
  b.namespace_id = {7, 8};
  b.key_hash = {offset, ~offset};
  b.extent_offset = offset;
  b.extent_bytes = 8192;
  b.payload_checksum = 0x1234;
  b.kind = static_cast<uint8_t>(EntryKind::Block);
  b.evidence = static_cast<uint8_t>(Evidence::DefaultAutomatic);
  return b;
}

StateRecord* record_in(StateSegment& s, uint64_t index) {
  return reinterpret_cast<StateRecord*>(s.base() + s.records_offset()) + index;
}

TEST(StateSegment, CapacityHoldsEveryEntryAnArenaCanHold) {
  auto s = make_segment();
  EXPECT_EQ(s->record_capacity(), arena_bytes / 8192);
  EXPECT_EQ(s->records_high_water(), 0u);
  s->write_record(s->record_capacity() - 1, body_at(0), 0, 0);
  EXPECT_EQ(s->records_high_water(), s->record_capacity());
}

TEST(StateSegment, ARecordIsEmptyValidOrDamagedWhateverByteWasWrittenOver) {
  auto s = make_segment();
  StateRecord r{};
  EXPECT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Empty);
  s->write_record(0, body_at(4096), 3, 5);
  ASSERT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Valid);
  EXPECT_EQ(r.body.extent_offset, 4096u);
  EXPECT_EQ(r.hits, 3u);
  // Every byte of the checksummed part, and the checksum and valid word themselves.
  const size_t checked = offsetof(StateRecord, body) + sizeof(StateRecordBody);
  for (size_t i = 0; i < checked; ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(record_in(*s, 0));
    bytes[i] ^= 0x5a;
    const auto check = s->check_record(0, r);
    EXPECT_NE(check, StateSegment::RecordCheck::Valid) << "byte " << i;
    bytes[i] ^= 0x5a;
  }
  ASSERT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Valid);
  s->clear_record(0);
  EXPECT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Empty);
}

TEST(StateSegment, ARewriteInvalidatesTheRecordUntilItIsWholeAgain) {
  auto s = make_segment();
  s->write_record(0, body_at(4096), 0, 0);
  StateRecord* r = record_in(*s, 0);
  // What a kill between the first store of a rewrite and its last leaves behind.
  r->valid = 0;
  r->body.extent_offset = 8192;
  StateRecord out{};
  EXPECT_EQ(s->check_record(0, out), StateSegment::RecordCheck::Empty);
  s->write_record(0, body_at(8192), 0, 0);
  ASSERT_EQ(s->check_record(0, out), StateSegment::RecordCheck::Valid);
  EXPECT_EQ(out.body.extent_offset, 8192u);
}

TEST(StateSegment, UpgradeWordAppliesOnlyWhenItsCheckHolds) {
  auto s = make_segment();
  s->write_record(0, body_at(4096), 0, 0);
  s->write_upgrade(0, static_cast<uint8_t>(EntryClass::Shared),
                   static_cast<uint8_t>(Evidence::ExplicitBreakpoint), true);
  StateRecord r{};
  ASSERT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Valid);
  uint8_t entry_class = 0, evidence = 0;
  bool pinned = false;
  EXPECT_TRUE(StateSegment::upgraded(r, entry_class, evidence, pinned));
  EXPECT_EQ(entry_class, static_cast<uint8_t>(EntryClass::Shared));
  EXPECT_EQ(evidence, static_cast<uint8_t>(Evidence::ExplicitBreakpoint));
  EXPECT_TRUE(pinned);
  r.upgrade ^= 0x100;  // a torn or scribbled word: the values at seal stand
  EXPECT_FALSE(StateSegment::upgraded(r, entry_class, evidence, pinned));
  EXPECT_EQ(entry_class, static_cast<uint8_t>(EntryClass::Private));
  EXPECT_EQ(evidence, static_cast<uint8_t>(Evidence::DefaultAutomatic));
  EXPECT_FALSE(pinned);
  // An upgrade of an earlier write of this index does not carry over to a new one.
  const uint64_t stale = record_in(*s, 0)->upgrade;
  s->write_record(0, body_at(4096), 0, 0);
  record_in(*s, 0)->upgrade = stale;
  ASSERT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Valid);
  EXPECT_FALSE(StateSegment::upgraded(r, entry_class, evidence, pinned));
}

TEST(StateSegment, AdoptionRefusesAHeaderWrittenOver) {
  auto s = make_segment();
  s->write_record(0, body_at(4096), 0, 0);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(s->fd()), adopted, err), Status::Ok);
  StateRecord r{};
  EXPECT_EQ(adopted->check_record(0, r), StateSegment::RecordCheck::Valid);
  EXPECT_EQ(adopted->header().arena_identity, 42u);
  adopted.reset();
  s->base()[20] ^= 1;  // inside the header
  EXPECT_EQ(StateSegment::adopt(dup(s->fd()), adopted, err), Status::Corrupt);
}

// A reserved extent's record is a kind of its own, with the same crash rule; sealing
// rewrites it in place as an entry's record.
TEST(StateSegment, AReservationRecordIsItsOwnKindWhateverByteWasWrittenOverAndSealsInPlace) {
  auto s = make_segment();
  StateRecord r{};
  s->write_reservation(0, body_at(4096));
  ASSERT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Reservation);
  EXPECT_EQ(r.body.extent_offset, 4096u);
  const size_t checked = offsetof(StateRecord, body) + sizeof(StateRecordBody);
  for (size_t i = 0; i < checked; ++i) {
    auto* bytes = reinterpret_cast<uint8_t*>(record_in(*s, 0));
    bytes[i] ^= 0x5a;
    const auto check = s->check_record(0, r);
    EXPECT_TRUE(check == StateSegment::RecordCheck::Damaged ||
                check == StateSegment::RecordCheck::Empty)
        << "byte " << i;
    bytes[i] ^= 0x5a;
  }
  s->write_record(0, body_at(4096), 0, 0);
  EXPECT_EQ(s->check_record(0, r), StateSegment::RecordCheck::Valid);
}

// A segment of format 1 (no reservation records) is adopted by this release.
TEST(StateSegment, AdoptionTakesTheFormatBeforeReservationRecords) {
  auto s = make_segment();
  s->write_record(0, body_at(4096), 0, 0);
  StateHeader h{};
  std::memcpy(&h, s->base(), sizeof h);
  EXPECT_EQ(h.format_version, state_format_version);
  h.format_version = 1;
  h.checksum = XXH3_64bits(&h, offsetof(StateHeader, checksum));
  std::memcpy(s->base(), &h, sizeof h);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(s->fd()), adopted, err), Status::Ok);
  StateRecord r{};
  EXPECT_EQ(adopted->check_record(0, r), StateSegment::RecordCheck::Valid);
  adopted.reset();
  h.format_version = state_format_version + 1;
  h.checksum = XXH3_64bits(&h, offsetof(StateHeader, checksum));
  std::memcpy(s->base(), &h, sizeof h);
  EXPECT_EQ(StateSegment::adopt(dup(s->fd()), adopted, err), Status::Corrupt);
}

TEST(StateSegment, ConnectionWordsNameAPidOrNothing) {
  auto s = make_segment();
  s->set_connection(3, 4242);
  EXPECT_EQ(s->connection_pid(3), 4242u);
  EXPECT_EQ(s->connection_pid(4), 0u);
  s->clear_connection(3);
  EXPECT_EQ(s->connection_pid(3), 0u);
}

using testing::free_huge_pages;

std::unique_ptr<StateSegment> make_segment(HugePages huge_pages,
                                           const std::string& directory = {}) {
  std::unique_ptr<StateSegment> segment;
  int err = 0;
  EXPECT_EQ(StateSegment::create({.arena_identity = 43,
                                  .arena_data_bytes = arena_bytes,
                                  .configured_arena_bytes = arena_bytes,
                                  .huge_pages = static_cast<uint16_t>(huge_pages)},
                                 segment, err, directory),
            Status::Ok);
  return segment;
}

TEST(StateSegment, WithHugePagesAllowedAndReservedItIsOnThemAndAdoptedLikeAnyOther) {
  const uint64_t pages_needed =
      state_huge_segment_bytes(state_segment_bytes(state_record_capacity_for(arena_bytes))) /
      state_huge_page_bytes;
  if (free_huge_pages() < pages_needed)
    GTEST_SKIP() << "too few huge pages reserved: `sysctl vm.nr_hugepages=" << pages_needed
                 << "` runs this";
  auto segment = make_segment(HugePages::Try);
  ASSERT_TRUE(segment);
  EXPECT_TRUE(segment->on_huge_pages());
  segment->write_record(3, body_at(8192), 1, 2);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(segment->fd()), adopted, err), Status::Ok);
  EXPECT_TRUE(adopted->on_huge_pages());
  StateRecord r{};
  EXPECT_EQ(adopted->check_record(3, r), StateSegment::RecordCheck::Valid);
  EXPECT_EQ(r.body.extent_offset, 8192u);
}

TEST(StateSegment, WithHugePagesOffItIsOn4KiBPagesUnadvised) {
  auto off = make_segment(HugePages::Off);
  ASSERT_TRUE(off);
  EXPECT_FALSE(off->on_huge_pages());
  EXPECT_FALSE(off->on_transparent_pages());
  EXPECT_EQ(off->bytes(), state_segment_bytes(state_record_capacity_for(arena_bytes)));
  EXPECT_FALSE(testing::smaps_advised_huge(off->base()));
}

// Without a pool, a segment that may use huge pages is shmem mapped so that transparent
// ones can back it: whole 2 MiB pages, a 2 MiB-aligned mapping advised MADV_HUGEPAGE
// ("hg"), here and again at adoption, where a restarted daemon reads every record.
TEST(StateSegment, WithHugePagesAllowedAndNoneFreeItIsAdvisedForTransparentHugePages) {
  if (free_huge_pages() > 0) GTEST_SKIP() << "huge pages are reserved here";
  auto tried = make_segment(HugePages::Try);
  ASSERT_TRUE(tried);
  EXPECT_FALSE(tried->on_huge_pages());
  EXPECT_EQ(tried->on_transparent_pages(), shmem_transparent_allowed());
  EXPECT_EQ(tried->bytes(),
            state_huge_segment_bytes(state_segment_bytes(state_record_capacity_for(arena_bytes))));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(tried->base()) % transparent_huge_page_bytes, 0u);
  EXPECT_TRUE(testing::smaps_advised_huge(tried->base()));
  tried->write_record(3, body_at(8192), 1, 2);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(tried->fd()), adopted, err), Status::Ok);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(adopted->base()) % transparent_huge_page_bytes, 0u);
  EXPECT_TRUE(testing::smaps_advised_huge(adopted->base()));
  EXPECT_EQ(adopted->on_transparent_pages(), shmem_transparent_allowed());
  StateRecord r{};
  EXPECT_EQ(adopted->check_record(3, r), StateSegment::RecordCheck::Valid);
}

// Where the kernel's policy gives them, the records a restarted daemon reads are on
// 2 MiB pages in its new mapping (one fault per 2 MiB: docs/operations.md).
TEST(StateSegment, WhereShmemAllowsTransparentHugePagesAnAdoptedSegmentReadsThroughThem) {
  if (free_huge_pages() > 0) GTEST_SKIP() << "huge pages are reserved here";
  if (!shmem_transparent_allowed())
    GTEST_SKIP() << "shmem_enabled gives no transparent huge pages here: `echo advise > "
                    "/sys/kernel/mm/transparent_hugepage/shmem_enabled` runs this";
  auto segment = make_segment(HugePages::Try);
  ASSERT_TRUE(segment);
  for (uint64_t i = 0; i < segment->record_capacity(); ++i)
    segment->write_record(i, body_at(i * 8192), 1, 2);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(segment->fd()), adopted, err), Status::Ok);
  uint64_t valid = 0;
  const RecordsToAdopt adopting = adopted->records_to_adopt();
  for (const StateRecord& record : adopting.records())
    valid += StateSegment::check(record) == StateSegment::RecordCheck::Valid;
  EXPECT_EQ(valid, segment->record_capacity());
  EXPECT_GT(testing::smaps_field(adopting.records().data(), "ShmemPmdMapped:").value_or(0), 0u);
}

// Adoption reads the records through a view of their own that is read-only and already
// mapped (a first read through a writable mapping costs several times more on some VMs:
// docs/operations.md); writes still go through the segment, and the view goes with
// the adoption.
TEST(StateSegment, RecordsToAdoptAreReadThroughAReadOnlyViewMappedBeforeTheyAreRead) {
  auto segment = make_segment(HugePages::Off);
  ASSERT_TRUE(segment);
  const uint64_t written = segment->record_capacity();  // records over many pages
  for (uint64_t i = 0; i < written; ++i) segment->write_record(i, body_at(i * 8192), 1, 2);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(segment->fd()), adopted, err), Status::Ok);
  const void* view = nullptr;
  {
    const RecordsToAdopt adopting = adopted->records_to_adopt();
    ASSERT_EQ(adopting.records().size(), written);
    view = adopting.records().data();
    EXPECT_NE(view, adopted->base() + adopted->records_offset());
    const std::string flags = testing::smaps_text(view, "VmFlags:").value_or("");
    EXPECT_NE(flags.find(" rd"), std::string::npos) << flags;
    EXPECT_EQ(flags.find(" wr"), std::string::npos) << flags;
    const uint64_t records_bytes = written * sizeof(StateRecord);
    EXPECT_GE(testing::smaps_field(view, "Rss:").value_or(0) * 1024, records_bytes / 4096 * 4096);
    StateRecord whole{};
    EXPECT_EQ(adopted->check_record(7, whole), StateSegment::RecordCheck::Valid);
    EXPECT_EQ(std::memcmp(&adopting.records()[7], &whole, sizeof whole), 0);
    // A record adoption drops is cleared through the segment; the view sees it.
    adopted->clear_record(7);
    EXPECT_EQ(StateSegment::check(adopting.records()[7]), StateSegment::RecordCheck::Empty);
  }
  EXPECT_FALSE(testing::smaps_text(view, "Rss:").has_value());  // unmapped with the adoption
}

// kept_memory_dir (the shipped unit mounts a tmpfs with huge=within_size there): the
// segment is an unnamed file of that tmpfs, not a memfd, and its pages are 2 MiB where
// the mount gives them, whatever shmem_enabled says. on_transparent_pages() reports
// what the kernel gave: the header's page, as the file's allocated bytes show it.
TEST(StateSegment, InAKeptMemoryDirectoryItIsAFileOfThatTmpfsOnThePagesItsMountGives) {
  if (free_huge_pages() > 0) GTEST_SKIP() << "huge pages are reserved here: they come first";
  testing::HugeTmpfs tmpfs;
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  auto segment = make_segment(HugePages::Try, tmpfs.path());
  ASSERT_TRUE(segment);
  EXPECT_TRUE(tmpfs.holds_unnamed(segment->fd()));
  struct stat file {};
  ASSERT_EQ(fstat(segment->fd(), &file), 0);
  EXPECT_EQ(file.st_size, static_cast<off_t>(segment->bytes()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(segment->base()) % transparent_huge_page_bytes, 0u);
  EXPECT_TRUE(testing::smaps_advised_huge(segment->base()));
  const bool huge_page = static_cast<uint64_t>(file.st_blocks) * 512 >= transparent_huge_page_bytes;
  EXPECT_EQ(segment->on_transparent_pages(), huge_page);
  if (!huge_page) std::printf("the kernel gave the tmpfs no huge page here (fragmented memory?)\n");

  segment->write_record(3, body_at(8192), 1, 2);
  std::unique_ptr<StateSegment> adopted;
  int err = 0;
  ASSERT_EQ(StateSegment::adopt(dup(segment->fd()), adopted, err), Status::Ok);
  EXPECT_EQ(adopted->on_transparent_pages(), huge_page);
  StateRecord r{};
  EXPECT_EQ(adopted->check_record(3, r), StateSegment::RecordCheck::Valid);
  EXPECT_EQ(r.body.extent_offset, 8192u);
}

// A kept_memory_dir on another file system is never used: the segment is a sealed memfd,
// as without one.
TEST(StateSegment, InADirectoryOfAnotherFileSystemItIsASealedMemfdAsWithoutOne) {
  struct statfs fs {};
  ASSERT_EQ(statfs("/var/tmp", &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << "/var/tmp is a tmpfs here";
  auto segment = make_segment(HugePages::Off, "/var/tmp");
  ASSERT_TRUE(segment);
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(segment->fd());
  ASSERT_GT(readlink(link.c_str(), target, sizeof target - 1), 0);
  EXPECT_EQ(std::string(target).rfind("/memfd:kvparkd-state", 0), 0u) << target;
  EXPECT_NE(fcntl(segment->fd(), F_GET_SEALS) & F_SEAL_GROW, 0);
}

}  // namespace
}  // namespace kvpark::shm
