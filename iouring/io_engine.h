// The I/O seam of the disk tier: an asynchronous queue of reads, writes and syncs.
//
// DiskStore talks only to IoEngine. UringEngine is the real one; FaultInjectingEngine wraps
// any engine and fails chosen operations, so tests reach every error path with real files.
// An engine is used by one thread at a time (the store's worker).
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::disk {

enum class IoOp : uint8_t { Read, Write, Fsync };

struct IoRequest {
  IoOp op = IoOp::Read;
  int fd = -1;
  void* buffer = nullptr;       // Read/Write; O_DIRECT-aligned
  uint64_t bytes = 0;           // Read/Write
  uint64_t offset = 0;          // Read/Write
  int fixed_buffer_index = -1;  // registered buffer holding [buffer, +bytes), or -1
  bool datasync = true;         // Fsync: fdatasync (true) or fsync (false, e.g. a directory)
  uint64_t tag = 0;             // returned in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int64_t result = 0;  // bytes transferred (0 for Fsync), or -errno
};

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  // Queues one operation; false when queue_depth() operations are already in flight.
  virtual bool submit(const IoRequest& request) = 0;
  // Hands queued operations to the kernel; 0 or -errno.
  virtual int flush() = 0;
  // Flushes, waits until at least min_complete completions are ready, appends all ready
  // ones to ret; returns how many it appended or -errno.
  virtual int wait(std::vector<IoCompletion>& ret, unsigned min_complete) = 0;
  virtual unsigned queue_depth() const = 0;
  virtual unsigned in_flight() const = 0;
  // Registered buffer index covering [buffer, +bytes) entirely, or -1.
  virtual int fixed_buffer_index(const void* buffer, uint64_t bytes) const = 0;
};

}  // namespace kvpark::disk
