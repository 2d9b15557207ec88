// Index memory kept in the fd store (see kept_memory.h).
#include "daemon/kept_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <iterator>
#include <utility>
#include <vector>

#include "daemon/huge_page_allocator.h"

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

}  // namespace

Status KeptMemory::open(int kept_fd, std::unique_ptr<KeptMemory>& ret_memory, int& ret_err) {
  int fd = kept_fd;
  if (fd >= 0 && !usable(fd)) {
    close(fd);
    fd = -1;
  }
  const bool kept = fd >= 0;
  if (!kept) {
    fd = memfd_create("kvpark-index-memory", MFD_CLOEXEC);
    if (fd < 0 || !usable(fd)) {
      ret_err = errno;
      if (fd >= 0) close(fd);
      return Status::IoError;
    }
  }
  std::unique_ptr<KeptMemory> memory(new KeptMemory(fd, kept));
  memory->list_ranges();
  ret_memory = std::move(memory);
  return Status::Ok;
}

KeptMemory::~KeptMemory() {
  assert(mappings_.empty() && "every array drawn from it is gone first");
  if (kept_memory.load() == this) use_kept_memory(nullptr);
  close(fd_);
}

void KeptMemory::list_ranges() {
  // Backed ranges, rounded out to whole units (a live array may have left its last
  // pages untouched), then the gaps between them as empty ranges.
  uint64_t at = 0;
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

void* KeptMemory::map(size_t bytes) {
  const uint64_t size = round_up(bytes);
  std::lock_guard lock(mutex_);
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
  // An aligned window first (mmap aligns to 4 KiB only), then the file over it.
  void* window = map_aligned_anonymous(size);
  if (window == nullptr) return nullptr;
  void* p = mmap(window, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    munmap(window, size);
    return nullptr;
  }
  if (backed_bytes > 0 && backed_bytes < size) {
    const uint64_t tail = size - backed_bytes;
    const auto after = std::next(chosen);
    free_.erase(chosen);
    carve(after, tail);
  } else {
    carve(chosen, size);
  }
  // Best effort: shmem huge pages need shmem_enabled=advise; populating kept pages
  // writes page-table entries in one call instead of a fault per page (the empty tail
  // is left to fault in as it is used). A read populate: a read fault on a shared file
  // mapping maps the pages around it too (fault-around, 16 at a time), writable since
  // shmem keeps no dirty accounting, so it costs a third of a write populate and the
  // writes after it do not fault.
  (void)madvise(p, size, MADV_HUGEPAGE);
  if (backed_bytes > 0) (void)madvise(p, backed_bytes, MADV_POPULATE_READ);
  mappings_[reinterpret_cast<uintptr_t>(p)] = Mapping{.offset = offset, .bytes = size};
  return p;
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
