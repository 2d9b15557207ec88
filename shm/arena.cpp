// Creation, commitment, sealing and mapping of the host arena (see arena.h).
#include "shm/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "shm/mapping.h"

namespace kvpark::shm {
namespace {

#ifndef MFD_NOEXEC_SEAL
constexpr unsigned mfd_noexec_seal = 0x0008U;  // Linux 6.3; older kernels answer EINVAL
#else
constexpr unsigned mfd_noexec_seal = MFD_NOEXEC_SEAL;
#endif
#ifndef MADV_POPULATE_WRITE
constexpr int madv_populate_write = 23;  // Linux 5.14
#else
constexpr int madv_populate_write = MADV_POPULATE_WRITE;
#endif

constexpr uint64_t prefault_region_bytes = 2ull * 1024 * 1024;  // a huge page, 512 small ones
constexpr uint32_t small_page_bytes = 4096;

uint64_t now_unix_usec() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

// memfd_create, preferring a non-executable object where the kernel knows the flag.
int create_memfd(const std::string& name, unsigned flags) {
  int fd = memfd_create(name.c_str(), flags | MFD_CLOEXEC | MFD_ALLOW_SEALING | mfd_noexec_seal);
  if (fd < 0 && errno == EINVAL) fd = memfd_create(name.c_str(), flags | MFD_CLOEXEC | MFD_ALLOW_SEALING);
  return fd;
}

struct Backing {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  ArenaPages pages = ArenaPages::Small;
  uint32_t page_bytes = small_page_bytes;
};

// A hugetlb memfd with every page allocated now; errno on failure.
bool create_hugetlb(const ArenaOptions& o, uint64_t data_bytes, Backing& ret) {
  int fd = create_memfd(o.name, MFD_HUGETLB);
  if (fd < 0) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_blksize <= 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return false;
  }
  const uint64_t page = static_cast<uint64_t>(st.st_blksize);
  const uint64_t bytes = align_up(data_bytes, page);
  // fallocate takes the pages from the reserved pool now: too few is ENOSPC here, at
  // start, never SIGBUS under a client later.
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return false;
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    errno = err;
    return false;
  }
  ret = {.fd = fd, .base = static_cast<uint8_t*>(base), .bytes = bytes, .pages = ArenaPages::Hugetlb,
         .page_bytes = static_cast<uint32_t>(page)};
  return true;
}

// A shmem memfd with every page allocated now, on 2 MiB pages where the kernel allows.
bool create_shmem(const ArenaOptions& o, uint64_t data_bytes, bool transparent, Backing& ret) {
  int fd = create_memfd(o.name, 0);
  if (fd < 0) return false;
  const uint64_t bytes = align_up(data_bytes, transparent ? transparent_huge_page_bytes : small_page_bytes);
  auto fail = [&] {
    const int err = errno;
    close(fd);
    errno = err;
    return false;
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail();
  uint8_t* base = nullptr;
  if (transparent) {
    base =
        map_aligned(fd, bytes, transparent_huge_page_bytes, PROT_READ | PROT_WRITE, MAP_NORESERVE);
    if (base == nullptr) return fail();
    // Allocating through the mapping lets the advice choose 2 MiB pages; fallocate
    // would allocate 4 KiB ones under "advise".
    (void)madvise(base, bytes, MADV_HUGEPAGE);
    if (madvise(base, bytes, madv_populate_write) != 0) {
      if (errno != EINVAL) {
        const int err = errno;
        munmap(base, bytes);
        errno = err;
        return fail();
      }
      if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
        munmap(base, bytes);
        errno = err;
        return fail();
      }
    }
  } else {
    if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      errno = err;
      return fail();
    }
    // Not populated: the pages exist now, and the daemon touches only entry headers.
    // Page tables for every 4 KiB page would cost seconds per 8 GiB here, and as much
    // again when the process exits, in the way of every restart.
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return fail();
    base = static_cast<uint8_t*>(m);
  }
  ret = {.fd = fd, .base = base, .bytes = bytes, .pages = ArenaPages::Small, .page_bytes = small_page_bytes};
  if (transparent && shmem_pmd_mapped_bytes(base) > 0) {
    ret.pages = ArenaPages::Transparent;
    ret.page_bytes = static_cast<uint32_t>(transparent_huge_page_bytes);
  }
  return true;
}

}  // namespace

const char* arena_pages_name(ArenaPages pages) {
  switch (pages) {
    case ArenaPages::Small: return "4k";
    case ArenaPages::Transparent: return "thp";
    case ArenaPages::Hugetlb: return "hugetlb";
  }
  return "unknown";
}

Status check_arena_header(const ArenaHeader& h, uint64_t data_bytes) {
  const bool ok = h.magic == arena_magic && h.format_version == arena_format_version &&
                  h.header_bytes == limits::arena_header_bytes && h.data_bytes == data_bytes &&
                  h.extent_align_bytes == limits::extent_align_bytes &&
                  h.entry_header_bytes == limits::entry_header_bytes &&
                  h.data_bytes % limits::extent_align_bytes == 0 &&
                  h.pages <= static_cast<uint32_t>(ArenaPages::Hugetlb) && h.page_bytes >= small_page_bytes &&
                  (h.page_bytes & (h.page_bytes - 1)) == 0 && h.data_bytes % h.page_bytes == 0;
  return ok ? Status::Ok : Status::Corrupt;
}

Status ArenaOwner::create(const ArenaOptions& options, std::unique_ptr<ArenaOwner>& ret_arena,
                          int& ret_errno, ArenaCreation* ret_creation) {
  if (options.name.empty() || options.name.size() > limits::arena_name_bytes_max ||
      options.data_bytes < limits::arena_bytes_min) {
    ret_errno = EINVAL;
    return Status::InvalidArgument;
  }
  const uint64_t requested = align_up(options.data_bytes, limits::extent_align_bytes);
  ArenaCreation creation;
  creation.transparent_allowed = options.huge_pages != HugePages::Off && shmem_transparent_allowed();
  Backing backing;
  bool made = false;
  if (options.huge_pages != HugePages::Off) {
    made = create_hugetlb(options, requested, backing);
    if (!made) creation.hugetlb_errno = errno;
    if (!made && options.huge_pages == HugePages::On) {
      if (ret_creation != nullptr) *ret_creation = creation;
      ret_errno = creation.hugetlb_errno;
      return Status::ArenaFull;
    }
  }
  if (!made && !create_shmem(options, requested, creation.transparent_allowed, backing)) {
    ret_errno = errno;
    if (ret_creation != nullptr) *ret_creation = creation;
    return errno == ENOSPC || errno == ENOMEM ? Status::ArenaFull : Status::IoError;
  }
  creation.pages = backing.pages;
  auto arena = std::unique_ptr<ArenaOwner>(new ArenaOwner());
  arena->data_fd_ = backing.fd;
  arena->data_ = backing.base;
  arena->mapped_bytes_ = backing.bytes;
  arena->name_ = options.name;
  auto fail = [&](int err) {
    ret_errno = err;
    return Status::IoError;
  };
  // No client may resize the data object: a shrink would be SIGBUS in the daemon.
  if (fcntl(arena->data_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return fail(errno);

  ArenaHeader header{};
  header.magic = arena_magic;
  header.format_version = arena_format_version;
  header.header_bytes = limits::arena_header_bytes;
  header.data_bytes = backing.bytes;
  header.incarnation = options.incarnation;
  header.created_unix_usec = now_unix_usec();
  header.extent_align_bytes = limits::extent_align_bytes;
  header.entry_header_bytes = limits::entry_header_bytes;
  header.pages = static_cast<uint32_t>(backing.pages);
  header.page_bytes = backing.page_bytes;
  arena->header_fd_ = create_memfd(options.name + "-header", 0);
  if (arena->header_fd_ < 0) return fail(errno);
  uint8_t page[limits::arena_header_bytes] = {};
  std::memcpy(page, &header, sizeof header);
  if (ftruncate(arena->header_fd_, limits::arena_header_bytes) != 0 ||
      pwrite(arena->header_fd_, page, sizeof page, 0) != static_cast<ssize_t>(sizeof page)) {
    return fail(errno);
  }
  // Sealed before any client sees it: written once, by the daemon, never again.
  if (fcntl(arena->header_fd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail(errno);
  }
  void* h = mmap(nullptr, limits::arena_header_bytes, PROT_READ, MAP_SHARED, arena->header_fd_, 0);
  if (h == MAP_FAILED) return fail(errno);
  arena->header_ = static_cast<const ArenaHeader*>(h);
  assert(check_arena_header(arena->header(), backing.bytes) == Status::Ok);
  if (ret_creation != nullptr) *ret_creation = creation;
  ret_arena = std::move(arena);
  return Status::Ok;
}

Status ArenaOwner::adopt(int header_fd, int data_fd, std::unique_ptr<ArenaOwner>& ret_arena,
                         int& ret_errno) {
  auto arena = std::unique_ptr<ArenaOwner>(new ArenaOwner());
  arena->header_fd_ = header_fd;  // closed by the destructor on every failure below
  arena->data_fd_ = data_fd;
  ret_errno = 0;
  struct stat hst {}, dst {};
  const int header_seals = fcntl(header_fd, F_GET_SEALS);
  const int data_seals = fcntl(data_fd, F_GET_SEALS);
  if (fstat(header_fd, &hst) != 0 || fstat(data_fd, &dst) != 0 ||
      static_cast<uint64_t>(hst.st_size) != limits::arena_header_bytes || header_seals < 0 ||
      data_seals < 0 || (header_seals & header_seals_required) != header_seals_required ||
      (data_seals & data_seals_required) != data_seals_required) {
    return Status::Corrupt;
  }
  void* h = mmap(nullptr, limits::arena_header_bytes, PROT_READ, MAP_SHARED, header_fd, 0);
  if (h == MAP_FAILED) {
    ret_errno = errno;
    return Status::IoError;
  }
  arena->header_ = static_cast<const ArenaHeader*>(h);
  const uint64_t bytes = arena->header_->data_bytes;
  if (check_arena_header(*arena->header_, bytes) != Status::Ok ||
      static_cast<uint64_t>(dst.st_size) < bytes) {
    return Status::Corrupt;
  }
  // Not populated: the pages are there already, and the daemon touches only headers.
  // MAP_NORESERVE for the reason a client maps with it (ArenaMapping::attach).
  uint8_t* data = map_aligned(data_fd, bytes, arena->header_->page_bytes, PROT_READ | PROT_WRITE,
                              MAP_NORESERVE);
  if (data == nullptr) {
    ret_errno = errno;
    return Status::IoError;
  }
  arena->data_ = data;
  arena->mapped_bytes_ = bytes;
  ret_arena = std::move(arena);
  return Status::Ok;
}

ArenaOwner::~ArenaOwner() {
  if (data_ != nullptr) munmap(data_, mapped_bytes_);
  if (header_ != nullptr) munmap(const_cast<ArenaHeader*>(header_), limits::arena_header_bytes);
  if (data_fd_ >= 0) close(data_fd_);
  if (header_fd_ >= 0) close(header_fd_);
}

Status ArenaMapping::attach(int header_fd, int data_fd, uint64_t data_bytes, uint64_t incarnation,
                            std::shared_ptr<ArenaMapping>& ret_mapping) {
  auto done = [&](Status s) {
    if (header_fd >= 0) close(header_fd);
    if (data_fd >= 0) close(data_fd);
    return s;
  };
  struct stat hst {}, dst {};
  // The data object may have grown: F_SEAL_GROW stops ftruncate and write, but a
  // writable mmap past the end of a hugetlb memfd still extends its size. Nobody
  // maps beyond data_bytes, so growth changes nothing here; shrinking is sealed.
  if (header_fd < 0 || data_fd < 0 || fstat(header_fd, &hst) != 0 || fstat(data_fd, &dst) != 0 ||
      static_cast<uint64_t>(hst.st_size) != limits::arena_header_bytes ||
      static_cast<uint64_t>(dst.st_size) < data_bytes || data_bytes == 0) {
    return done(Status::Corrupt);
  }
  // Pair assertion with the daemon's create: an unsealed object is not the daemon's.
  const int header_seals = fcntl(header_fd, F_GET_SEALS);
  const int data_seals = fcntl(data_fd, F_GET_SEALS);
  if (header_seals < 0 || data_seals < 0 || (header_seals & header_seals_required) != header_seals_required ||
      (data_seals & data_seals_required) != data_seals_required) {
    return done(Status::Corrupt);
  }
  void* h = mmap(nullptr, limits::arena_header_bytes, PROT_READ, MAP_SHARED, header_fd, 0);
  if (h == MAP_FAILED) return done(Status::IoError);
  const auto* header = static_cast<const ArenaHeader*>(h);
  if (check_arena_header(*header, data_bytes) != Status::Ok || header->incarnation != incarnation) {
    munmap(h, limits::arena_header_bytes);
    return done(Status::Corrupt);
  }
  // Lazily mapped: attaching costs no page-table growth until pages are touched.
  // MAP_NORESERVE: every page was allocated at the daemon's start; on hugetlb a
  // mapping would otherwise reserve pool pages for any hole a client punched, and
  // fail (locking later clients out) once another client has emptied the pool.
  uint8_t* data =
      map_aligned(data_fd, data_bytes, header->page_bytes, PROT_READ | PROT_WRITE, MAP_NORESERVE);
  if (data == nullptr) {
    munmap(h, limits::arena_header_bytes);
    return done(Status::IoError);
  }
  if (header->pages == static_cast<uint32_t>(ArenaPages::Transparent)) {
    (void)madvise(data, data_bytes, MADV_HUGEPAGE);
  }
  auto mapping = std::shared_ptr<ArenaMapping>(new ArenaMapping());
  mapping->header_ = header;
  mapping->data_ = data;
  const uint64_t regions = (data_bytes + prefault_region_bytes - 1) / prefault_region_bytes;
  mapping->populated_ = std::make_unique<std::atomic<uint64_t>[]>((regions + 63) / 64);
  mapping->mapped_bytes_ = data_bytes;
  mapping->header_dev_ = hst.st_dev;
  mapping->header_ino_ = hst.st_ino;
  mapping->data_dev_ = dst.st_dev;
  mapping->data_ino_ = dst.st_ino;
  ret_mapping = std::move(mapping);
  return done(Status::Ok);
}

bool ArenaMapping::same_objects(int header_fd, int data_fd) const {
  struct stat hst {}, dst {};
  return fstat(header_fd, &hst) == 0 && fstat(data_fd, &dst) == 0 && hst.st_dev == header_dev_ &&
         hst.st_ino == header_ino_ && dst.st_dev == data_dev_ && dst.st_ino == data_ino_;
}

void ArenaMapping::prefault(const void* p, uint64_t bytes) {
  const auto* at = static_cast<const uint8_t*>(p);
  if (bytes < limits::prefault_min_bytes || at < data_ || at + bytes > data_ + data_bytes()) return;
  const uint64_t first = static_cast<uint64_t>(at - data_) / prefault_region_bytes;
  const uint64_t last = (static_cast<uint64_t>(at - data_) + bytes - 1) / prefault_region_bytes;
  // One madvise per run of regions not populated yet: a system call costs tens of
  // microseconds in some VMs, as much as populating a huge page, so a call per 2 MiB
  // would cost a first-touch copy of 1 GiB 10 ms more than one call for the run.
  uint64_t run_begin = first, run_end = first;  // regions [run_begin, run_end) to populate
  const auto populate_run = [&] {
    if (run_end == run_begin) return;
    const uint64_t begin = run_begin * prefault_region_bytes;
    const uint64_t end = std::min(run_end * prefault_region_bytes, data_bytes());
    // Best effort: before Linux 5.14 (EINVAL) the copy takes its faults as before.
    (void)madvise(data_ + begin, end - begin, madv_populate_write);
  };
  for (uint64_t r = first; r <= last; ++r) {
    const uint64_t bit = uint64_t{1} << (r % 64);
    if ((populated_[r / 64].fetch_or(bit, std::memory_order_relaxed) & bit) != 0) {
      populate_run();
      run_begin = run_end = r + 1;
      continue;
    }
    run_end = r + 1;
  }
  populate_run();
}

ArenaMapping::~ArenaMapping() {
  if (data_ != nullptr) munmap(data_, mapped_bytes_);
  if (header_ != nullptr) munmap(const_cast<ArenaHeader*>(header_), limits::arena_header_bytes);
}

}  // namespace kvpark::shm
