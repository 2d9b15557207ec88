// Creation, commitment and mapping of the host arena (see arena.h).
#include "shm/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace kvpark::shm {
namespace {

uint64_t now_unix_usec() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

Status check_arena_header(const ArenaHeader& h, uint64_t arena_bytes) {
  const bool ok = h.magic == arena_magic && h.format_version == arena_format_version &&
                  h.header_bytes == limits::arena_header_bytes &&
                  h.arena_bytes == arena_bytes && h.data_offset == limits::arena_header_bytes &&
                  h.data_bytes == arena_bytes - limits::arena_header_bytes &&
                  h.extent_align_bytes == limits::extent_align_bytes &&
                  h.entry_header_bytes == limits::entry_header_bytes &&
                  h.data_bytes % limits::extent_align_bytes == 0;
  return ok ? Status::Ok : Status::Corrupt;
}

Status ArenaOwner::create(const ArenaOptions& options, std::unique_ptr<ArenaOwner>& ret_arena,
                          int& ret_errno) {
  if (options.name.empty() || options.name[0] != '/' ||
      options.name.find('/', 1) != std::string::npos ||
      options.data_bytes < limits::arena_bytes_min) {
    ret_errno = EINVAL;
    return Status::InvalidArgument;
  }
  const uint64_t data_bytes = align_up(options.data_bytes, limits::extent_align_bytes);
  const uint64_t arena_bytes = limits::arena_header_bytes + data_bytes;

  // A stale object from a crashed daemon is replaced: its incarnation is over.
  (void)shm_unlink(options.name.c_str());
  int fd = shm_open(options.name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    ret_errno = errno;
    return Status::IoError;
  }
  auto fail = [&](int err) {
    close(fd);
    shm_unlink(options.name.c_str());
    ret_errno = err;
    return err == ENOSPC || err == ENOMEM ? Status::ArenaFull : Status::IoError;
  };
  if (ftruncate(fd, static_cast<off_t>(arena_bytes)) != 0) return fail(errno);
  // Commit every page now: tmpfs then cannot run out under a client's page fault
  // (which would be SIGBUS); a too-small /dev/shm fails here, at start, instead.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(arena_bytes)); err != 0) {
    return fail(err);
  }
  void* base = mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                    fd, 0);
  if (base == MAP_FAILED) return fail(errno);

  auto arena = std::unique_ptr<ArenaOwner>(new ArenaOwner());
  arena->fd_ = fd;
  arena->base_ = static_cast<uint8_t*>(base);
  arena->name_ = options.name;
  ArenaHeader header{};
  header.magic = arena_magic;
  header.format_version = arena_format_version;
  header.header_bytes = limits::arena_header_bytes;
  header.arena_bytes = arena_bytes;
  header.data_offset = limits::arena_header_bytes;
  header.data_bytes = data_bytes;
  header.incarnation = options.incarnation;
  header.created_unix_usec = now_unix_usec();
  header.extent_align_bytes = limits::extent_align_bytes;
  header.entry_header_bytes = limits::entry_header_bytes;
  std::memcpy(base, &header, sizeof header);
  assert(check_arena_header(arena->header(), arena_bytes) == Status::Ok);
  ret_arena = std::move(arena);
  return Status::Ok;
}

ArenaOwner::~ArenaOwner() {
  if (base_ != nullptr) munmap(base_, header().arena_bytes);
  if (fd_ >= 0) close(fd_);
  if (!name_.empty()) shm_unlink(name_.c_str());
}

Status ArenaMapping::attach(int fd, uint64_t arena_bytes, uint64_t incarnation,
                            std::shared_ptr<ArenaMapping>& ret_mapping) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != arena_bytes ||
      arena_bytes <= limits::arena_header_bytes) {
    close(fd);
    return Status::Corrupt;
  }
  void* header = mmap(nullptr, limits::arena_header_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (header == MAP_FAILED) {
    close(fd);
    return Status::IoError;
  }
  const auto* h = static_cast<const ArenaHeader*>(header);
  if (check_arena_header(*h, arena_bytes) != Status::Ok || h->incarnation != incarnation) {
    munmap(header, limits::arena_header_bytes);
    close(fd);
    return Status::Corrupt;
  }
  void* data = mmap(nullptr, h->data_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(limits::arena_header_bytes));
  close(fd);
  if (data == MAP_FAILED) {
    munmap(header, limits::arena_header_bytes);
    return Status::IoError;
  }
  auto mapping = std::shared_ptr<ArenaMapping>(new ArenaMapping());
  mapping->header_ = h;
  mapping->data_ = static_cast<uint8_t*>(data);
  ret_mapping = std::move(mapping);
  return Status::Ok;
}

ArenaMapping::~ArenaMapping() {
  if (data_ != nullptr) munmap(data_, header_->data_bytes);
  if (header_ != nullptr) munmap(const_cast<ArenaHeader*>(header_), limits::arena_header_bytes);
}

}  // namespace kvpark::shm
