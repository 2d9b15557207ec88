// The host arena: memory shared by the daemon and engines, as two memfds.
//
// The daemon creates it (ArenaOwner). The data object is sized and committed at
// start, so no later page fault can hit ENOSPC, then sealed against shrink and
// grow (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL): a client holding the fd can
// never make the daemon take SIGBUS. The header object is written once and sealed
// against writes (F_SEAL_WRITE), so no client can stop others from attaching.
// Engines receive both fds over the socket and map them (ArenaMapping): the header
// read-only, the data region read-write, lazily (no page is touched at attach).
// Both sides check the header and the seals (STYLE.md §4). Neither object has a
// name in /dev/shm: nothing is left behind when the daemon dies, unless the service
// manager keeps the fds (its fd store), and a restarted daemon adopts them: the
// header's incarnation is then the arena's identity, which outlives daemons.
//
// Pages: a hugetlb memfd when huge pages are reserved, else shmem with transparent
// huge pages where the kernel allows it, else 4 KiB pages (HugePages::Try).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "proto/status.h"
#include "shm/arena_format.h"

namespace kvpark::shm {

// The operator's huge-page setting (`huge_pages`), as in PostgreSQL.
enum class HugePages { Try, On, Off };

struct ArenaOptions {
  std::string name;         // memfd name, shown in /proc/PID/fd
  uint64_t data_bytes = 0;  // rounded up to the page size backing it
  uint64_t incarnation = 0;
  HugePages huge_pages = HugePages::Try;
};

// What creation tried and chose, for the daemon's one log line.
struct ArenaCreation {
  ArenaPages pages = ArenaPages::Small;
  int hugetlb_errno = 0;   // why a hugetlb memfd was not used (0: used or not tried)
  bool transparent_allowed = false;  // the kernel lets shmem use transparent huge pages
};

class ArenaOwner {
 public:
  // Creates, sizes, commits and seals the arena. On failure returns the status and
  // sets ret_errno; HugePages::On without enough reserved huge pages is ArenaFull.
  static Status create(const ArenaOptions& options, std::unique_ptr<ArenaOwner>& ret_arena,
                       int& ret_errno, ArenaCreation* ret_creation = nullptr);
  // Takes over the arena an earlier daemon created (fds the service manager kept):
  // maps both objects and checks header and seals as a client would. Takes both fds
  // (closed on failure); Corrupt when they are not a sealed arena.
  static Status adopt(int header_fd, int data_fd, std::unique_ptr<ArenaOwner>& ret_arena,
                      int& ret_errno);
  ~ArenaOwner();
  ArenaOwner(const ArenaOwner&) = delete;
  ArenaOwner& operator=(const ArenaOwner&) = delete;

  int header_fd() const { return header_fd_; }
  int data_fd() const { return data_fd_; }
  const ArenaHeader& header() const { return *header_; }
  uint8_t* data() const { return data_; }
  uint64_t data_bytes() const { return header_->data_bytes; }
  ArenaPages pages() const { return static_cast<ArenaPages>(header_->pages); }
  uint32_t page_bytes() const { return header_->page_bytes; }
  const std::string& name() const { return name_; }

 private:
  ArenaOwner() = default;
  int header_fd_ = -1;
  int data_fd_ = -1;
  const ArenaHeader* header_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t mapped_bytes_ = 0;
  std::string name_;
};

class ArenaMapping {
 public:
  // Maps an arena received from the daemon and checks its header and seals against
  // what HELLO said. Takes ownership of both fds (closed after mapping, success or not).
  static Status attach(int header_fd, int data_fd, uint64_t data_bytes, uint64_t incarnation,
                       std::shared_ptr<ArenaMapping>& ret_mapping);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  const ArenaHeader& header() const { return *header_; }
  uint8_t* data() const { return data_; }
  uint64_t data_bytes() const { return header_->data_bytes; }
  // True when [offset, offset+bytes) lies inside the data region.
  bool contains(uint64_t offset, uint64_t bytes) const {
    return offset <= data_bytes() && bytes <= data_bytes() - offset;
  }
  // Before a large copy through this mapping: fills the page tables of the 2 MiB
  // regions [p, p+bytes) touches that this mapping has not filled yet, one
  // MADV_POPULATE_WRITE per run of them, instead of one page fault per page during the copy
  // (a fresh mapping after an engine restart; faults are dear in a VM). Attaching
  // still maps nothing. Copies under limits::prefault_min_bytes are left to faults.
  void prefault(const void* p, uint64_t bytes);
  // Whether these fds are the objects this mapping maps (a daemon that adopted the
  // arena passes the same ones again: the mapping, its page tables included, stays).
  bool same_objects(int header_fd, int data_fd) const;

 private:
  ArenaMapping() = default;
  uint64_t header_dev_ = 0, header_ino_ = 0, data_dev_ = 0, data_ino_ = 0;
  const ArenaHeader* header_ = nullptr;
  uint8_t* data_ = nullptr;
  // One bit per 2 MiB region whose page tables this mapping has filled.
  std::unique_ptr<std::atomic<uint64_t>[]> populated_;
  uint64_t mapped_bytes_ = 0;  // of data_
};

// Validates a header page; used by both sides.
Status check_arena_header(const ArenaHeader& header, uint64_t data_bytes);

// Seals each object must carry (checked by clients at attach).
inline constexpr int data_seals_required = 0x0002 | 0x0004 | 0x0001;  // SHRINK | GROW | SEAL
inline constexpr int header_seals_required = 0x0008 | 0x0002 | 0x0004 | 0x0001;  // + WRITE

const char* arena_pages_name(ArenaPages pages);  // "4k", "thp", "hugetlb"

}  // namespace kvpark::shm
