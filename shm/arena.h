// The host arena: a POSIX shared-memory object shared by the daemon and engines.
//
// The daemon creates it (ArenaOwner), commits every page at start so that no later
// page fault can raise SIGBUS, and writes the header once. Engines receive its fd
// over the socket and map it (ArenaMapping): the header page read-only, the data
// region read-write. Both sides check the header (STYLE.md §4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "proto/status.h"
#include "shm/arena_format.h"

namespace kvpark::shm {

struct ArenaOptions {
  std::string name;        // shm_open name, e.g. "/kvpark-arena"
  uint64_t data_bytes = 0; // rounded up to extent_align_bytes
  uint64_t incarnation = 0;
};

class ArenaOwner {
 public:
  // Creates (replacing a stale object of the same name), sizes and commits the arena.
  // On failure returns the status and sets ret_errno.
  static Status create(const ArenaOptions& options, std::unique_ptr<ArenaOwner>& ret_arena,
                       int& ret_errno);
  ~ArenaOwner();
  ArenaOwner(const ArenaOwner&) = delete;
  ArenaOwner& operator=(const ArenaOwner&) = delete;

  int fd() const { return fd_; }
  const ArenaHeader& header() const { return *reinterpret_cast<const ArenaHeader*>(base_); }
  uint8_t* data() const { return base_ + limits::arena_header_bytes; }
  uint64_t data_bytes() const { return header().data_bytes; }
  uint64_t arena_bytes() const { return header().arena_bytes; }
  const std::string& name() const { return name_; }

 private:
  ArenaOwner() = default;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  std::string name_;
};

class ArenaMapping {
 public:
  // Maps an arena received from the daemon and checks its header against what HELLO said.
  // Takes ownership of fd (closed after mapping, success or not).
  static Status attach(int fd, uint64_t arena_bytes, uint64_t incarnation,
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

 private:
  ArenaMapping() = default;
  const ArenaHeader* header_ = nullptr;
  uint8_t* data_ = nullptr;
};

// Validates a header page; used by both sides.
Status check_arena_header(const ArenaHeader& header, uint64_t arena_bytes);

}  // namespace kvpark::shm
