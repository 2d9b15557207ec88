// Index memory kept in the fd store (see kept_memory.h).
#include "daemon/kept_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <iterator>
#include <utility>
#include <vector>

#include "daemon/aligned_mapping.h"
#include "shm/mapping.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14; older kernels say EINVAL and fault instead
#endif

namespace kvpark::daemon {
namespace {

static_assert(kept_memory_unit_bytes == huge_page_bytes,
              "a unit is what map_aligned_anonymous aligns to");

std::atomic<KeptMemory*> kept_memory{nullptr};

uint64_t round_up(uint64_t bytes) {
  return (bytes + kept_memory_unit_bytes - 1) / kept_memory_unit_bytes * kept_memory_unit_bytes;
}
uint64_t round_down(uint64_t bytes) {
  return bytes / kept_memory_unit_bytes * kept_memory_unit_bytes;
}

// The memfd is ours, sized to kept_memory_bytes_max; false (errno set) otherwise.
bool usable(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) {
    errno = EINVAL;
    return false;
  }
  if (static_cast<uint64_t>(st.st_size) == kept_memory_bytes_max) return true;
  return ftruncate(fd, static_cast<off_t>(kept_memory_bytes_max)) == 0;
}

// A new memfd (or, with `directory`, an unnamed tmpfs file) of kept_memory_bytes_max;
// -1 (errno set) when it cannot be made.
int new_file(unsigned int memfd_flags, const std::string& directory) {
  const int fd = directory.empty() ? memfd_create("kvpark-index-memory", MFD_CLOEXEC | memfd_flags)
                                   : shm::create_tmpfs_file(directory);
  if (fd < 0 || usable(fd)) return fd;
  const int err = errno;
  close(fd);
  errno = err;
  return -1;
}

// The header unit of `fd`, mapped as every range is (2 MiB-aligned; when `transparent`,
// advised for transparent huge pages and read once, so that its first page is
// allocated as the kernel allocates the rest); nullptr when it cannot be mapped (on
// reserved huge pages: none left, which a shared hugetlb mapping says at mmap).
uint8_t* map_header(int fd, bool transparent) {
  auto* header = shm::map_aligned(fd, kept_memory_header_bytes, kept_memory_unit_bytes,
                                  PROT_READ | PROT_WRITE, 0);
  if (header == nullptr || !transparent) return header;
  (void)madvise(header, kept_memory_header_bytes, MADV_HUGEPAGE);
  (void)*reinterpret_cast<volatile uint8_t*>(header);
  return header;
}

}  // namespace

Status KeptMemory::open(int kept_fd, bool huge_pages, std::unique_ptr<KeptMemory>& ret_memory,
                        int& ret_err, const std::string& directory) {
  auto on_hugetlbfs = [](int fd) {
    struct statfs fs {};
    return fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
  };
  int fd = kept_fd;
  uint8_t* header = nullptr;
  if (fd >= 0) {
    if (usable(fd)) header = map_header(fd, huge_pages && !on_hugetlbfs(fd));
    if (header == nullptr) {
      close(fd);
      fd = -1;
    }
  }
  const bool kept = fd >= 0;
  // Reserved huge pages when allowed and there are any: the next instance reads the
  // index through a new mapping, and on 4 KiB pages that first read of each page costs
  // more than the read on some VMs (docs/operations.md). Else a file in `directory`,
  // whose tmpfs mount may give 2 MiB pages where shmem_enabled gives a memfd none.
  auto make = [&](unsigned int memfd_flags, const std::string& in) {
    if (fd >= 0) return;
    fd = new_file(memfd_flags, in);
    if (fd < 0) return;
    header = map_header(fd, huge_pages && !on_hugetlbfs(fd));
    if (header == nullptr) {
      const int err = errno;
      close(fd);
      errno = err;
      fd = -1;
    }
  };
  if (huge_pages) make(MFD_HUGETLB, {});
  if (!directory.empty()) make(0, directory);
  make(0, {});
  if (fd < 0) {
    ret_err = errno;
    return Status::IoError;
  }
  std::unique_ptr<KeptMemory> memory(new KeptMemory(fd, kept));
  memory->header_ = header;
  memory->huge_pages_ = on_hugetlbfs(fd);
  memory->transparent_ = huge_pages && !memory->huge_pages_;
  memory->transparent_pages_ = memory->transparent_ && shm::shmem_pmd_mapped_bytes(header) > 0;
  memory->list_ranges();
  ret_memory = std::move(memory);
  return Status::Ok;
}

KeptMemory::~KeptMemory() {
  assert(mappings_.empty() && "every array drawn from it is gone first");
  if (kept_memory.load() == this) use_kept_memory(nullptr);
  munmap(header_, kept_memory_header_bytes);
  close(fd_);
}

void KeptMemory::list_ranges() {
  if (huge_pages_) {
    // hugetlbfs reports no holes: every range is free, none known to hold pages (an
    // index image names its own), and release_unused() gives back whatever is left.
    // The header page is read first, so that it is allocated and the count is exact.
    (void)*static_cast<volatile uint8_t*>(header_);
    struct stat st {};
    if (fstat(fd_, &st) == 0) {
      const uint64_t held = static_cast<uint64_t>(st.st_blocks) * 512;
      kept_bytes_ = held > kept_memory_header_bytes ? held - kept_memory_header_bytes : 0;
    }
    free_[kept_memory_header_bytes] =
        Range{.bytes = kept_memory_bytes_max - kept_memory_header_bytes, .backed = false};
    return;
  }
  // Backed ranges, rounded out to whole units (a live array may have left its last
  // pages untouched), then the gaps between them as empty ranges. The header unit is
  // never a range.
  uint64_t at = kept_memory_header_bytes;
  size_t n = 0;
  for (; n < kept_memory_backed_ranges_max && at < kept_memory_bytes_max; ++n) {
    const off_t data = lseek(fd_, static_cast<off_t>(at), SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past `at`
    const off_t hole = lseek(fd_, data, SEEK_HOLE);
    if (hole < 0) break;
    const uint64_t begin = std::max(at, round_down(static_cast<uint64_t>(data)));
    const uint64_t end = std::min(kept_memory_bytes_max, round_up(static_cast<uint64_t>(hole)));
    if (begin > at) free_[at] = Range{.bytes = begin - at, .backed = false};
    if (end > begin) {
      free_[begin] = Range{.bytes = end - begin, .backed = true};
      kept_bytes_ += end - begin;
    }
    at = std::max(at, end);
  }
  if (at < kept_memory_bytes_max) {
    free_[at] = Range{.bytes = kept_memory_bytes_max - at, .backed = false};
    // Past the most runs listed, pages are not reused: give them back now, or nothing
    // would (release_unused() frees only the ranges listed as backed).
    if (n == kept_memory_backed_ranges_max) {
      (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at),
                      static_cast<off_t>(kept_memory_bytes_max - at));
    }
  }
}

void KeptMemory::carve(std::map<uint64_t, Range>::iterator at, uint64_t bytes) {
  const uint64_t offset = at->first;
  const Range range = at->second;
  assert(range.bytes >= bytes);
  free_.erase(at);
  if (range.bytes > bytes)
    free_[offset + bytes] = Range{.bytes = range.bytes - bytes, .backed = range.backed};
}

void* KeptMemory::map_file_range(uint64_t offset, uint64_t bytes) const {
  // An aligned window first (mmap aligns to 4 KiB only), then the file over it.
  void* window = map_aligned_anonymous(bytes);
  if (window == nullptr) return nullptr;
  void* p = mmap(window, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    munmap(window, bytes);
    return nullptr;
  }
  return p;
}

void* KeptMemory::map(size_t bytes) {
  const uint64_t size = round_up(bytes);
  std::lock_guard lock(mutex_);
  if (next_map_ != nullptr) {
    const auto it = mappings_.find(reinterpret_cast<uintptr_t>(next_map_));
    assert(it != mappings_.end() && it->second.bytes == size &&
           "served to the array it was made for");
    (void)it;
    return std::exchange(next_map_, nullptr);
  }
  // First fit among the ranges that hold pages, else the first empty one. A range that
  // holds pages also fits with the empty range right after it: an array's last pages
  // were reserved but never touched, so the same array asked for again finds its
  // touched pages followed by that empty tail.
  auto chosen = free_.end();
  uint64_t backed_bytes = 0;  // of the chosen range, the bytes that hold pages
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    const Range& range = it->second;
    if (range.backed) {
      const auto after = std::next(it);
      const bool tail_fits = after != free_.end() && after->first == it->first + range.bytes &&
                             !after->second.backed && range.bytes + after->second.bytes >= size;
      if (range.bytes >= size || tail_fits) {
        chosen = it;
        backed_bytes = std::min(range.bytes, size);
        break;
      }
    } else if (range.bytes >= size && chosen == free_.end()) {
      chosen = it;
    }
  }
  if (chosen == free_.end()) return nullptr;
  const uint64_t offset = chosen->first;
  void* p = map_file_range(offset, size);
  if (p == nullptr) return nullptr;
  if (backed_bytes > 0 && backed_bytes < size) {
    const uint64_t tail = size - backed_bytes;
    const auto after = std::next(chosen);
    free_.erase(chosen);
    carve(after, tail);
  } else {
    carve(chosen, size);
  }
  // Best effort: shmem huge pages need shmem_enabled=advise and the advice (given
  // where huge pages are allowed); populating kept pages writes page-table entries in
  // one call instead of a fault per page (the empty tail is left to fault in as it is
  // used). A read populate: a read fault on a shared file
  // mapping maps the pages around it too (fault-around, 16 at a time), writable since
  // shmem keeps no dirty accounting, so it costs a third of a write populate and the
  // writes after it do not fault.
  if (transparent_) (void)madvise(p, size, MADV_HUGEPAGE);
  if (backed_bytes > 0) (void)madvise(p, backed_bytes, MADV_POPULATE_READ);
  mappings_[reinterpret_cast<uintptr_t>(p)] = Mapping{.offset = offset, .bytes = size};
  return p;
}

void* KeptMemory::map_range(uint64_t offset, uint64_t bytes, uint64_t populate_bytes) {
  if (offset % kept_memory_unit_bytes != 0 || bytes == 0 || bytes % kept_memory_unit_bytes != 0 ||
      populate_bytes > bytes) {
    return nullptr;
  }
  std::lock_guard lock(mutex_);
  // The free ranges covering all of it, back to back (an array's touched pages are
  // listed apart from the untouched rest of its mapping), if any.
  auto first = free_.upper_bound(offset);
  if (first == free_.begin()) return nullptr;
  --first;
  const uint64_t end = offset + bytes;
  if (end < offset) return nullptr;
  auto last = first;
  uint64_t covered_to = first->first + first->second.bytes;
  while (covered_to < end) {
    const auto next = std::next(last);
    if (next == free_.end() || next->first != covered_to) return nullptr;
    last = next;
    covered_to += next->second.bytes;
  }
  if (covered_to < offset) return nullptr;
  void* p = map_file_range(offset, bytes);
  if (p == nullptr) return nullptr;
  const uint64_t head_begin = first->first;
  const Range head = first->second, tail = last->second;
  const uint64_t tail_end = covered_to;
  free_.erase(first, std::next(last));
  if (offset > head_begin)
    free_[head_begin] = Range{.bytes = offset - head_begin, .backed = head.backed};
  if (tail_end > end) free_[end] = Range{.bytes = tail_end - end, .backed = tail.backed};
  if (transparent_) (void)madvise(p, bytes, MADV_HUGEPAGE);
  if (populate_bytes > 0) (void)madvise(p, populate_bytes, MADV_POPULATE_READ);
  mappings_[reinterpret_cast<uintptr_t>(p)] = Mapping{.offset = offset, .bytes = bytes};
  return p;
}

void KeptMemory::serve_next_map(void* p) {
  std::lock_guard lock(mutex_);
  assert(mappings_.count(reinterpret_cast<uintptr_t>(p)) == 1 && next_map_ == nullptr);
  next_map_ = p;
}

bool KeptMemory::find_mapping(const void* p, uint64_t& ret_offset, uint64_t& ret_bytes) {
  std::lock_guard lock(mutex_);
  const auto it = mappings_.find(reinterpret_cast<uintptr_t>(p));
  if (it == mappings_.end()) return false;
  ret_offset = it->second.offset;
  ret_bytes = it->second.bytes;
  return true;
}

void KeptMemory::unmap_keeping_pages(void* p) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(reinterpret_cast<uintptr_t>(p));
  assert(it != mappings_.end());
  const Mapping m = it->second;
  mappings_.erase(it);
  munmap(p, m.bytes);
  // Back on the free list as a range that holds pages, a candidate for the next map().
  free_[m.offset] = Range{.bytes = m.bytes, .backed = true};
}

bool KeptMemory::unmap(void* p) {
  std::lock_guard lock(mutex_);
  auto it = mappings_.find(reinterpret_cast<uintptr_t>(p));
  if (it == mappings_.end()) return false;
  const Mapping m = it->second;
  mappings_.erase(it);
  munmap(p, m.bytes);
  if (keep_pages_) return true;
  // The pages go back to the system: what the memfd holds is the live arrays.
  (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(m.offset),
                  static_cast<off_t>(m.bytes));
  release(m.offset, m.bytes);
  return true;
}

uint64_t KeptMemory::release_unused() {
  std::lock_guard lock(mutex_);
  if (huge_pages_) {
    // Whatever pages lie outside the live mappings are the previous instance's.
    struct stat st {};
    const auto held = [&] {
      return fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
    };
    const uint64_t before = held();
    for (const auto& [offset, range] : free_) {
      (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(range.bytes));
    }
    const uint64_t after = held();
    return before > after ? before - after : 0;
  }
  uint64_t released = 0;
  std::vector<std::pair<uint64_t, uint64_t>> backed;
  for (const auto& [offset, range] : free_) {
    if (range.backed) backed.emplace_back(offset, range.bytes);
  }
  for (const auto& [offset, bytes] : backed) {
    (void)fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                    static_cast<off_t>(bytes));
    free_.erase(offset);
    release(offset, bytes);
    released += bytes;
  }
  return released;
}

void KeptMemory::release(uint64_t offset, uint64_t bytes) {
  auto next = free_.lower_bound(offset);
  // Merge with empty neighbours; a backed neighbour stays apart (it is preferred).
  if (next != free_.end() && !next->second.backed && offset + bytes == next->first) {
    bytes += next->second.bytes;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (!prev->second.backed && prev->first + prev->second.bytes == offset) {
      prev->second.bytes += bytes;
      return;
    }
  }
  free_[offset] = Range{.bytes = bytes, .backed = false};
}

void use_kept_memory(KeptMemory* memory) {
  kept_memory.store(memory);
}

KeptMemory* kept_memory_in_use() {
  return kept_memory.load();
}

}  // namespace kvpark::daemon
