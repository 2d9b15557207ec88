// IoEngine on liburing: bounded queue depth, feature probe, fixed buffers.
//
// create() probes the ring and lists what is missing in plain words; register_buffers()
// registers caller memory (the arena data region) in <= 1 GiB pieces so transfers inside
// it use READ_FIXED/WRITE_FIXED (no page pinning per I/O). When registration fails
// (RLIMIT_MEMLOCK for an unprivileged user, an old kernel) the engine keeps working with
// readv/writev and says so.
#pragma once

#include <liburing.h>

#include <memory>
#include <string>
#include <vector>

#include "iouring/io_engine.h"
#include "proto/status.h"

namespace kvpark::disk {

struct EngineProbe {
  bool fixed_io = false;  // READ_FIXED / WRITE_FIXED supported
  bool fsync = false;
  std::vector<std::string> missing;  // human-readable, empty when all is there
};

class UringEngine final : public IoEngine {
 public:
  // Ok, or Unavailable when io_uring cannot be set up (ret_error says why).
  static Status create(unsigned queue_depth, std::unique_ptr<UringEngine>& ret, std::string& ret_error);
  ~UringEngine() override;

  const EngineProbe& probe() const { return probe_; }
  // Registers regions (each split into <= fixed_buffer_bytes_max pieces). Returns true when
  // registered; false with a reason when the engine stays on readv/writev for them.
  bool register_buffers(const std::vector<iovec>& regions, std::string& ret_reason);
  bool buffers_registered() const { return !fixed_.empty(); }

  bool submit(const IoRequest& request) override;
  int flush() override;
  int wait(std::vector<IoCompletion>& ret, unsigned min_complete) override;
  unsigned queue_depth() const override { return depth_; }
  unsigned in_flight() const override { return in_flight_; }
  int fixed_buffer_index(const void* buffer, uint64_t bytes) const override;

 private:
  UringEngine() = default;
  struct Slot {
    uint64_t tag = 0;
    iovec iov{};  // lives until completion: readv/writev may read it at issue time
  };
  io_uring ring_{};
  bool ring_ready_ = false;
  unsigned depth_ = 0;
  unsigned in_flight_ = 0;
  unsigned queued_ = 0;  // prepared, not yet submitted
  EngineProbe probe_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<iovec> fixed_;  // registered, in index order
};

}  // namespace kvpark::disk
