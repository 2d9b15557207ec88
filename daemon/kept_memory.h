// Memory for the entry table's bulk that a restarted kvparkd finds already backed.
//
// Why: rebuilding the index of 1M adopted entries writes about a quarter of a gigabyte.
// In a new process that is fresh memory, and on the VMs kvpark runs on first-touching
// that much costs about a second (the host backs guest memory lazily: docs/operations.md
// has the figures), several times the rebuild's own work. So under a service manager
// the daemon draws the table's large arrays (huge_page_allocator.h) from one memfd (or
// an unnamed file of kept_memory_dir, a tmpfs) that it keeps in the fd store beside the
// arena. The next instance gets it back with the
// pages of the arrays that were live still allocated, hands those ranges out first (a
// range with the empty range after it, when an array's last pages were never touched),
// and maps the kept part with MADV_POPULATE_READ: page-table entries (writable, a
// third of what a write populate costs), and new pages only where a range was rounded
// out to whole 2 MiB units.
//
// The memfd's first unit is a header: a clean stop describes there the index image it
// leaves in place (index_image.h), which the next instance adopts only after checking
// it against the state segment. Apart from an image, it holds no state: every array is
// constructed over its range before it is read, so a new instance trusts nothing else it
// finds there, and no client ever sees it. Its size is virtual (kept_memory_bytes_max,
// sparse); a range freed is punched out, so the pages it holds are the live arrays'
// and no more.
//
// With huge pages allowed and reserved ones free (vm.nr_hugepages), the memfd is on
// hugetlbfs; else it is on transparent huge pages where the kernel gives them
// (shmem_enabled for a memfd, the mount's huge= for a kept_memory_dir tmpfs). Reading a
// kept array through a new mapping then costs a fault per 2 MiB,
// where on 4 KiB pages some VMs charge several microseconds per page even after a
// populate (docs/operations.md). hugetlbfs reports no holes, so there no range is known
// to hold pages: an image maps its own, and release_unused() punches every free range.
// Thread-safe (one mutex): the allocator that calls it is global.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "proto/status.h"

namespace kvpark::daemon {

// The memfd's virtual size: room for the index of some 800M entries. Sparse: only the
// pages of live arrays are allocated.
inline constexpr uint64_t kept_memory_bytes_max = 256ull << 30;
// Ranges are handed out in these units, so every mapping can be on huge pages.
inline constexpr uint64_t kept_memory_unit_bytes = 2ull << 20;
// The memfd's first unit is no range: it holds the index image's header (index_image.h).
inline constexpr uint64_t kept_memory_header_bytes = kept_memory_unit_bytes;
// At start, the memfd's ranges that still hold pages are listed up to this many (the
// live arrays of the instance before: a handful); the rest are treated as empty.
inline constexpr size_t kept_memory_backed_ranges_max = 4096;

class KeptMemory {
 public:
  // Over `kept_fd` (a memfd the previous instance stored; taken), or a new memfd when
  // kept_fd < 0: on reserved huge pages (vm.nr_hugepages) when `huge_pages` allows and
  // any are free, else on shmem: an unnamed file in `directory` when it names a tmpfs
  // (shm::create_tmpfs_file()), else a memfd; mapped for transparent huge pages when
  // `huge_pages` allows (they back it where shmem_enabled, or the tmpfs mount's huge=,
  // gives them), else 4 KiB pages. Fails only when no memfd can be made or sized (errno
  // in ret_err); a kept fd that cannot serve is closed and a new one made in its place.
  static Status open(int kept_fd, bool huge_pages, std::unique_ptr<KeptMemory>& ret_memory,
                     int& ret_err, const std::string& directory = {});
  ~KeptMemory();
  KeptMemory(const KeptMemory&) = delete;
  KeptMemory& operator=(const KeptMemory&) = delete;

  int fd() const { return fd_; }
  // On reserved huge pages (hugetlbfs), not 4 KiB shmem pages.
  bool huge_pages() const { return huge_pages_; }
  // Else mapped for transparent huge pages, and its header is on one
  // (shm::shmem_pmd_mapped_bytes()): the kernel gives them.
  bool transparent_pages() const { return transparent_pages_; }
  // Over the memfd an earlier instance kept (false: a new one, to be stored).
  bool kept() const { return kept_; }
  // Bytes of the ranges that held pages when this instance opened the memfd, rounded
  // out to whole units: what it can reuse.
  uint64_t kept_bytes() const { return kept_bytes_; }

  // A 2 MiB-aligned mapping of `bytes` (rounded up to 2 MiB) over a free range of the
  // memfd, one that still holds pages when one fits (alone, or with the empty range
  // right after it); nullptr when none is left.
  void* map(size_t bytes);
  // Unmaps what map() returned and frees its pages; false (nothing done) when `p` is
  // not one of this memory's mappings.
  bool unmap(void* p);

  // The index image (index_image.h). The header unit, mapped for as long as this lives.
  uint8_t* header() const { return header_; }
  // A mapping of exactly [offset, +bytes) (whole units, inside one free range), its
  // first populate_bytes mapped with a read populate; nullptr when that range is not free.
  void* map_range(uint64_t offset, uint64_t bytes, uint64_t populate_bytes);
  // The next map() returns `p` (a map_range() mapping of the size it asks for): how an
  // array is handed its image's pages in place.
  void serve_next_map(void* p);
  // The memfd range of the mapping starting at `p`; false when `p` starts none.
  bool find_mapping(const void* p, uint64_t& ret_offset, uint64_t& ret_bytes);
  // Unmaps, leaving the pages where they are, free to the next map() that fits.
  void unmap_keeping_pages(void* p);
  // Gives back the pages of every kept range no array took (an index smaller than the
  // last instance's, or a fresh start); returns their bytes. Called once the index is
  // built, so what the memfd holds is the live arrays again.
  uint64_t release_unused();
  // The daemon is stopping: from now on unmap() leaves the pages to the next instance
  // (the arrays it frees on its way out are the ones that instance rebuilds).
  void keep_pages() {
    std::lock_guard lock(mutex_);
    keep_pages_ = true;
  }

 private:
  struct Range {
    uint64_t bytes = 0;
    bool backed = false;  // held pages when listed at open (a candidate to reuse)
  };
  struct Mapping {
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };

  KeptMemory(int fd, bool kept) : fd_(fd), kept_(kept) {}
  void list_ranges();
  // [offset, +bytes) of the memfd mapped 2 MiB-aligned; nullptr when it cannot be.
  void* map_file_range(uint64_t offset, uint64_t bytes)
      const;  // the free list over the whole memfd, backed ranges marked
  // Takes [offset, +bytes) out of the free range starting at `at`.
  void carve(std::map<uint64_t, Range>::iterator at, uint64_t bytes);
  void release(uint64_t offset, uint64_t bytes);  // back on the free list, merged

  int fd_ = -1;
  uint8_t* header_ = nullptr;
  void* next_map_ = nullptr;  // serve_next_map()
  bool kept_ = false;
  bool huge_pages_ = false;
  bool transparent_ = false;  // shmem mappings are advised MADV_HUGEPAGE
  bool transparent_pages_ = false;
  bool keep_pages_ = false;
  uint64_t kept_bytes_ = 0;
  std::mutex mutex_;
  std::map<uint64_t, Range> free_;         // by offset; neighbours never both unbacked
  std::map<uintptr_t, Mapping> mappings_;  // by address
};

// Routes map_huge_pages() to `memory` from now on (nullptr: anonymous mappings again).
// The daemon sets it before it builds its entry table; `memory` must outlive every
// mapping it serves.
void use_kept_memory(KeptMemory* memory);
KeptMemory* kept_memory_in_use();

}  // namespace kvpark::daemon
