// Index memory kept in the fd store (daemon/kept_memory.h): mappings are aligned and
// never overlap, a freed array gives its pages back, a restarted instance is handed the
// pages the last one left before any fresh range and gives back what it did not take,
// and the entry table's vectors draw from it while it is in use.
#include "daemon/kept_memory.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "daemon/huge_page_allocator.h"
#include "shm/mapping.h"
#include "tests/testing/huge_pages.h"
#include "tests/testing/huge_tmpfs.h"
#include "tests/testing/smaps.h"

namespace kvpark::daemon {
namespace {

constexpr size_t mib = 1u << 20;

std::unique_ptr<KeptMemory> open_memory(int kept_fd = -1) {
  std::unique_ptr<KeptMemory> memory;
  int err = 0;
  EXPECT_EQ(KeptMemory::open(kept_fd, false, memory, err), Status::Ok) << err;
  return memory;
}

using testing::free_huge_pages;

// Bytes of pages the memfd holds.
uint64_t allocated_bytes(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

// Whether the kernel gives shmem (a memfd) transparent huge pages unasked.
bool shmem_pages_are_huge() {
  std::ifstream policy("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(policy, line);
  for (const char* huge : {"[always]", "[within_size]", "[force]"}) {
    if (line.find(huge) != std::string::npos) return true;
  }
  return false;
}

bool all_bytes(const void* p, size_t bytes, uint8_t value) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) {
    if (b[i] != value) return false;
  }
  return true;
}

TEST(KeptMemory, AMappingIsAlignedWholeUnitsAndItsPagesGoWhenItIsFreed) {
  auto memory = open_memory();
  ASSERT_TRUE(memory);
  EXPECT_FALSE(memory->kept());
  EXPECT_EQ(memory->kept_bytes(), 0u);
  void* p = memory->map(3 * mib);  // rounded up to 4 MiB
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kept_memory_unit_bytes, 0u);
  std::memset(p, 0x5a, 4 * mib);
  EXPECT_EQ(allocated_bytes(memory->fd()), 4 * mib);
  EXPECT_TRUE(memory->unmap(p));
  EXPECT_EQ(allocated_bytes(memory->fd()), 0u);
  int not_mapped = 0;
  EXPECT_FALSE(memory->unmap(&not_mapped));
}

TEST(KeptMemory, MappingsNeverOverlapAndFreedRangesAreReused) {
  auto memory = open_memory();
  ASSERT_TRUE(memory);
  const size_t sizes[] = {2 * mib, 6 * mib, 4 * mib, 2 * mib};
  std::vector<void*> maps;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    maps.push_back(memory->map(sizes[i]));
    ASSERT_NE(maps.back(), nullptr);
    std::memset(maps.back(), static_cast<int>(i + 1), sizes[i]);
  }
  for (size_t i = 0; i < std::size(sizes); ++i)
    EXPECT_TRUE(all_bytes(maps[i], sizes[i], i + 1)) << i;
  // Freeing the 6 MiB one and asking for 8 MiB: it does not fit the hole, so it lands
  // elsewhere; the hole serves a later 6 MiB and nothing written before changes.
  ASSERT_TRUE(memory->unmap(maps[1]));
  void* larger = memory->map(8 * mib);
  ASSERT_NE(larger, nullptr);
  std::memset(larger, 9, 8 * mib);
  void* again = memory->map(6 * mib);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(all_bytes(again, 6 * mib, 0)) << "a freed range is punched: it reads zero";
  std::memset(again, 7, 6 * mib);
  EXPECT_TRUE(all_bytes(maps[0], 2 * mib, 1));
  EXPECT_TRUE(all_bytes(maps[2], 4 * mib, 3));
  EXPECT_TRUE(all_bytes(maps[3], 2 * mib, 4));
  EXPECT_TRUE(all_bytes(larger, 8 * mib, 9));
  for (void* p : {maps[0], maps[2], maps[3], larger, again}) EXPECT_TRUE(memory->unmap(p));
  EXPECT_EQ(allocated_bytes(memory->fd()), 0u);
}

TEST(KeptMemory, ARestartedInstanceIsHandedThePagesTheLastOneLeftBeforeAnyFreshRange) {
  int fd = -1;
  {
    auto previous = open_memory();
    ASSERT_TRUE(previous);
    void* live = previous->map(8 * mib);
    void* untouched = previous->map(4 * mib);  // reserved, never written: no pages
    ASSERT_NE(live, nullptr);
    ASSERT_NE(untouched, nullptr);
    std::memset(live, 0xab, 8 * mib);
    fd = dup(previous->fd());
    previous->keep_pages();  // a stopping daemon: its arrays' pages stay
    previous->unmap(live);
    previous->unmap(untouched);
  }
  ASSERT_GE(fd, 0);
  auto next = open_memory(fd);
  ASSERT_TRUE(next);
  EXPECT_TRUE(next->kept());
  EXPECT_EQ(next->kept_bytes(), 8 * mib);
  // The earlier pages, still holding what the last instance wrote (the memory is
  // trusted for nothing: whoever maps it writes it before reading).
  void* reused = next->map(4 * mib);
  ASSERT_NE(reused, nullptr);
  EXPECT_TRUE(all_bytes(reused, 4 * mib, 0xab));
  // 4 MiB of kept pages are left, too few for 8 alone: they come with the empty
  // range after them (the untouched array's), and a later request gets a fresh range.
  void* extended = next->map(8 * mib);
  ASSERT_NE(extended, nullptr);
  EXPECT_TRUE(all_bytes(extended, 4 * mib, 0xab));
  EXPECT_TRUE(all_bytes(static_cast<uint8_t*>(extended) + 4 * mib, 4 * mib, 0));
  void* fresh = next->map(4 * mib);
  ASSERT_NE(fresh, nullptr);
  EXPECT_TRUE(all_bytes(fresh, 4 * mib, 0));
  for (void* p : {reused, extended, fresh}) EXPECT_TRUE(next->unmap(p));
}

TEST(KeptMemory, AnArrayWhoseLastPagesWereNeverTouchedGetsItsRangeBackWhole) {
  // The entry slab is reserved for every record the state ever held and written only
  // as far as the live entries reached; the next instance asks for the same size.
  int fd = -1;
  {
    auto previous = open_memory();
    ASSERT_TRUE(previous);
    void* slab = previous->map(8 * mib);
    void* cells = previous->map(4 * mib);
    ASSERT_NE(slab, nullptr);
    ASSERT_NE(cells, nullptr);
    std::memset(slab, 0xab, 4 * mib);  // half of it touched
    std::memset(cells, 0xcd, 4 * mib);
    fd = dup(previous->fd());
    previous->keep_pages();
    previous->unmap(slab);
    previous->unmap(cells);
  }
  ASSERT_GE(fd, 0);
  auto next = open_memory(fd);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->kept_bytes(), 8 * mib);
  void* slab = next->map(8 * mib);
  void* cells = next->map(4 * mib);
  ASSERT_NE(slab, nullptr);
  ASSERT_NE(cells, nullptr);
  EXPECT_EQ(next->release_unused(), 0u);  // every kept page was taken
  // Nothing populated past the touched pages (before reading the tail faults it in).
  EXPECT_EQ(allocated_bytes(next->fd()), 8 * mib);
  EXPECT_TRUE(all_bytes(slab, 4 * mib, 0xab));  // its own pages, not a fresh range
  EXPECT_TRUE(all_bytes(static_cast<uint8_t*>(slab) + 4 * mib, 4 * mib, 0));
  EXPECT_TRUE(all_bytes(cells, 4 * mib, 0xcd));
  for (void* p : {slab, cells}) EXPECT_TRUE(next->unmap(p));
}

TEST(KeptMemory, KeptPagesNoArrayTookAreGivenBack) {
  int fd = -1;
  {
    auto previous = open_memory();
    ASSERT_TRUE(previous);
    void* live = previous->map(8 * mib);
    ASSERT_NE(live, nullptr);
    std::memset(live, 1, 8 * mib);
    fd = dup(previous->fd());
    previous->keep_pages();
    previous->unmap(live);
  }
  auto next = open_memory(fd);
  ASSERT_TRUE(next);
  void* smaller = next->map(2 * mib);  // a smaller index than the last instance's
  ASSERT_NE(smaller, nullptr);
  EXPECT_EQ(allocated_bytes(next->fd()), 8 * mib);
  EXPECT_EQ(next->release_unused(), 6 * mib);
  EXPECT_EQ(allocated_bytes(next->fd()), 2 * mib);
  EXPECT_EQ(next->release_unused(), 0u);
  // The given-back range is an ordinary empty one, merged with the rest: 8 MiB fits.
  void* larger = next->map(8 * mib);
  ASSERT_NE(larger, nullptr);
  EXPECT_TRUE(all_bytes(larger, 8 * mib, 0));
  EXPECT_TRUE(all_bytes(smaller, 2 * mib, 1));
  EXPECT_TRUE(next->unmap(smaller));
  EXPECT_TRUE(next->unmap(larger));
  EXPECT_EQ(allocated_bytes(next->fd()), 0u);
}

TEST(KeptMemory, PagesPastTheMostRunsListedAreGivenBackAtOpen) {
  // A memfd scattered into more backed runs than are listed (a scribbled store, or
  // many small arrays): what is not listed cannot be reused, and is not left behind.
  if (shmem_pages_are_huge()) GTEST_SKIP() << "a byte per run would allocate 8 GiB of huge pages";
  int fd = -1;
  {
    auto previous = open_memory();
    ASSERT_TRUE(previous);
    fd = dup(previous->fd());
  }
  ASSERT_GE(fd, 0);
  const uint8_t byte = 1;
  for (uint64_t run = 0; run < kept_memory_backed_ranges_max + 8; ++run) {
    ASSERT_EQ(
        pwrite(fd, &byte, 1,
               static_cast<off_t>(kept_memory_header_bytes + run * 2 * kept_memory_unit_bytes)),
        1);
  }
  auto next = open_memory(fd);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->kept_bytes(), kept_memory_backed_ranges_max * kept_memory_unit_bytes);
  // Nothing past the last listed run holds a page any more.
  const off_t past = static_cast<off_t>(kept_memory_header_bytes +
                                        kept_memory_backed_ranges_max * 2 * kept_memory_unit_bytes);
  errno = 0;
  EXPECT_EQ(lseek(next->fd(), past - static_cast<off_t>(kept_memory_unit_bytes), SEEK_DATA), -1);
  EXPECT_EQ(errno, ENXIO);
}

TEST(KeptMemory, AKeptFdThatIsNoMemfdIsReplacedByANewOne) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  close(pipe_fds[1]);
  auto memory = open_memory(pipe_fds[0]);  // taken: closed, a new memfd made
  ASSERT_TRUE(memory);
  EXPECT_FALSE(memory->kept());
  void* p = memory->map(2 * mib);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(memory->unmap(p));
}

TEST(KeptMemory, ARequestLargerThanTheMemoryIsRefused) {
  auto memory = open_memory();
  ASSERT_TRUE(memory);
  // Everything past the header unit (index_image.h), which is never handed out.
  EXPECT_EQ(memory->map(kept_memory_bytes_max - kept_memory_header_bytes + 1), nullptr);
  void* whole = memory->map(kept_memory_bytes_max - kept_memory_header_bytes);  // virtual
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(memory->map(kept_memory_unit_bytes), nullptr);
  EXPECT_TRUE(memory->unmap(whole));
}

TEST(KeptMemory, HugePageVectorsDrawFromTheMemoryInUseAndFallBackWithout) {
  auto memory = open_memory();
  ASSERT_TRUE(memory);
  use_kept_memory(memory.get());
  {
    HugePageVector<uint64_t> v(4 * mib / sizeof(uint64_t));
    for (size_t i = 0; i < v.size(); ++i) v[i] = i;
    EXPECT_EQ(allocated_bytes(memory->fd()), 4 * mib);
    v.resize(v.size() * 2);  // grows into a new range, the old one freed
    for (size_t i = 0; i < v.size() / 2; ++i) ASSERT_EQ(v[i], i);
    EXPECT_EQ(allocated_bytes(memory->fd()), 8 * mib);
  }
  EXPECT_EQ(allocated_bytes(memory->fd()), 0u);
  use_kept_memory(nullptr);
  HugePageVector<uint64_t> anonymous(4 * mib / sizeof(uint64_t), 1);
  EXPECT_EQ(allocated_bytes(memory->fd()), 0u);
}

TEST(KeptMemory, WithHugePagesAllowedItIsOnReservedOnesWhenFreeAndGivesBackWhatIsLeft) {
  std::unique_ptr<KeptMemory> memory;
  int err = 0;
  ASSERT_EQ(KeptMemory::open(-1, true, memory, err), Status::Ok) << err;
  if (free_huge_pages() == 0 && !memory->huge_pages()) {
    GTEST_SKIP() << "no huge pages reserved: `sysctl vm.nr_hugepages=8` runs this";
  }
  ASSERT_TRUE(memory->huge_pages());
  void* p = memory->map(4 * mib);
  ASSERT_NE(p, nullptr);
  std::memset(p, 0x5a, 4 * mib);
  memory->keep_pages();  // a stopping daemon
  EXPECT_TRUE(memory->unmap(p));
  const int fd = dup(memory->fd());
  memory.reset();
  // hugetlbfs reports no holes: the next instance knows the pages only by their count,
  // and gives every one back when nothing (an index image) took them.
  ASSERT_EQ(KeptMemory::open(fd, true, memory, err), Status::Ok) << err;
  EXPECT_TRUE(memory->kept() && memory->huge_pages());
  EXPECT_EQ(memory->kept_bytes(), 4 * mib);
  EXPECT_EQ(memory->release_unused(), 4 * mib);
  EXPECT_EQ(allocated_bytes(memory->fd()), kept_memory_header_bytes);
}

// Without a pool, index memory that may use huge pages is shmem advised MADV_HUGEPAGE
// ("hg"), kept or new: where shmem_enabled gives transparent huge pages, a restarted
// daemon reads the index a fault per 2 MiB. With huge pages off it is not advised.
TEST(KeptMemory, WithHugePagesAllowedButNoneFreeItIsAdvisedForTransparentHugePages) {
  if (free_huge_pages() > 0) GTEST_SKIP() << "huge pages are reserved here";
  for (const bool kept : {false, true}) {
    std::unique_ptr<KeptMemory> memory;
    int err = 0;
    ASSERT_EQ(KeptMemory::open(-1, true, memory, err), Status::Ok) << err;
    if (kept) {
      const int fd = dup(memory->fd());
      memory.reset();
      ASSERT_EQ(KeptMemory::open(fd, true, memory, err), Status::Ok) << err;
    }
    EXPECT_FALSE(memory->huge_pages());
    EXPECT_EQ(memory->transparent_pages(), shm::shmem_transparent_allowed());
    void* p = memory->map(2 * mib);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(testing::smaps_advised_huge(p)) << "kept " << kept;
    EXPECT_TRUE(memory->unmap(p));
  }
  auto off = open_memory();
  EXPECT_FALSE(off->transparent_pages());
  void* p = off->map(2 * mib);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(testing::smaps_advised_huge(p));
  EXPECT_TRUE(off->unmap(p));
}

// kept_memory_dir: new index memory is an unnamed file of that tmpfs (the shipped unit
// mounts it with huge=within_size, which gives 2 MiB pages whatever shmem_enabled says),
// kept and reused across a restart as a memfd is; transparent_pages() reports what the
// kernel gave its header, as the file's allocated bytes show it.
TEST(KeptMemory, InAKeptMemoryDirectoryItIsAFileOfThatTmpfsOnThePagesItsMountGives) {
  if (free_huge_pages() > 0) GTEST_SKIP() << "huge pages are reserved here: they come first";
  testing::HugeTmpfs tmpfs;
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.why_not();
  std::unique_ptr<KeptMemory> memory;
  int err = 0;
  ASSERT_EQ(KeptMemory::open(-1, true, memory, err, tmpfs.path()), Status::Ok) << err;
  EXPECT_TRUE(tmpfs.holds_unnamed(memory->fd()));
  EXPECT_FALSE(memory->huge_pages());
  const bool huge_page = allocated_bytes(memory->fd()) >= kept_memory_unit_bytes;
  EXPECT_EQ(memory->transparent_pages(), huge_page);
  void* p = memory->map(4 * mib);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(testing::smaps_advised_huge(p));
  std::memset(p, 0x3c, 4 * mib);
  if (huge_page) {
    EXPECT_EQ(testing::smaps_field(p, "ShmemPmdMapped:").value_or(0), 4 * 1024u);
  }
  memory->keep_pages();
  EXPECT_TRUE(memory->unmap(p));

  const int fd = dup(memory->fd());
  memory.reset();
  ASSERT_EQ(KeptMemory::open(fd, true, memory, err, tmpfs.path()), Status::Ok) << err;
  EXPECT_TRUE(memory->kept());
  EXPECT_EQ(memory->kept_bytes(), 4 * mib);
  EXPECT_EQ(memory->transparent_pages(), huge_page);
  void* again = memory->map(4 * mib);
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(all_bytes(again, 4 * mib, 0x3c));
  EXPECT_TRUE(memory->unmap(again));
}

}  // namespace
}  // namespace kvpark::daemon
