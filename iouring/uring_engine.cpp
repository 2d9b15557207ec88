#include "iouring/uring_engine.h"

#include <cassert>
#include <cerrno>
#include <cstring>

#include "iouring/disk_limits.h"

namespace kvpark::disk {

Status UringEngine::create(unsigned queue_depth, std::unique_ptr<UringEngine>& ret, std::string& ret_error) {
  assert(queue_depth >= 1 && queue_depth <= queue_depth_max);
  std::unique_ptr<UringEngine> engine(new UringEngine());
  // CQ twice the SQ (liburing default): with at most depth in flight it never overflows.
  int rc = io_uring_queue_init(queue_depth, &engine->ring_, 0);
  if (rc < 0) {
    ret_error = std::string("io_uring_queue_init: ") + strerror(-rc) +
                (rc == -EPERM ? " (io_uring disabled by sysctl kernel.io_uring_disabled or seccomp)" : "");
    return Status::Unavailable;
  }
  engine->ring_ready_ = true;
  engine->depth_ = queue_depth;

  io_uring_probe* probe = io_uring_get_probe_ring(&engine->ring_);
  auto has = [&](int op) { return probe != nullptr && io_uring_opcode_supported(probe, op); };
  EngineProbe& p = engine->probe_;
  if (probe == nullptr) p.missing.push_back("IORING_REGISTER_PROBE (kernel < 5.6): opcodes assumed present");
  bool readv = probe == nullptr || has(IORING_OP_READV);
  bool writev = probe == nullptr || has(IORING_OP_WRITEV);
  p.fsync = probe == nullptr || has(IORING_OP_FSYNC);
  p.fixed_io = probe == nullptr || (has(IORING_OP_READ_FIXED) && has(IORING_OP_WRITE_FIXED));
  if (!p.fixed_io) p.missing.push_back("READ_FIXED/WRITE_FIXED: transfers use readv/writev");
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!readv || !writev || !p.fsync) {
    ret_error = "io_uring lacks READV, WRITEV or FSYNC; the disk tier needs all three";
    return Status::Unavailable;
  }
  engine->slots_.resize(queue_depth);
  for (uint32_t i = queue_depth; i > 0; --i) engine->free_slots_.push_back(i - 1);
  ret = std::move(engine);
  return Status::Ok;
}

UringEngine::~UringEngine() {
  assert(in_flight_ == 0 && "destroying a ring with operations in flight");
  if (ring_ready_) io_uring_queue_exit(&ring_);
}

bool UringEngine::register_buffers(const std::vector<iovec>& regions, std::string& ret_reason) {
  assert(fixed_.empty());
  if (!probe_.fixed_io) {
    ret_reason = "kernel lacks READ_FIXED/WRITE_FIXED; using readv/writev";
    return false;
  }
  std::vector<iovec> pieces;
  for (const iovec& region : regions) {
    auto* base = static_cast<uint8_t*>(region.iov_base);
    for (uint64_t off = 0; off < region.iov_len; off += fixed_buffer_bytes_max) {
      uint64_t len = std::min<uint64_t>(fixed_buffer_bytes_max, region.iov_len - off);
      pieces.push_back(iovec{base + off, len});
    }
  }
  if (pieces.empty()) return false;
  int rc = io_uring_register_buffers(&ring_, pieces.data(), static_cast<unsigned>(pieces.size()));
  if (rc < 0) {
    ret_reason = std::string("io_uring_register_buffers: ") + strerror(-rc) +
                 (rc == -ENOMEM || rc == -EPERM ? " (raise RLIMIT_MEMLOCK / LimitMEMLOCK=)" : "") +
                 "; using readv/writev";
    return false;
  }
  fixed_ = std::move(pieces);
  return true;
}

int UringEngine::fixed_buffer_index(const void* buffer, uint64_t bytes) const {
  auto p = reinterpret_cast<uintptr_t>(buffer);
  for (size_t i = 0; i < fixed_.size(); ++i) {
    auto base = reinterpret_cast<uintptr_t>(fixed_[i].iov_base);
    if (p >= base && p + bytes <= base + fixed_[i].iov_len) return static_cast<int>(i);
  }
  return -1;
}

bool UringEngine::submit(const IoRequest& r) {
  if (in_flight_ >= depth_) return false;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    // SQ full of unsubmitted entries: flush and retry once.
    if (flush() < 0) return false;
    sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return false;
  }
  uint32_t slot = free_slots_.back();
  free_slots_.pop_back();
  Slot& s = slots_[slot];
  s.tag = r.tag;
  s.iov = iovec{r.buffer, r.bytes};
  switch (r.op) {
    case IoOp::Read:
      if (r.fixed_buffer_index >= 0)
        io_uring_prep_read_fixed(sqe, r.fd, r.buffer, static_cast<unsigned>(r.bytes), r.offset, r.fixed_buffer_index);
      else
        io_uring_prep_readv(sqe, r.fd, &s.iov, 1, r.offset);
      break;
    case IoOp::Write:
      if (r.fixed_buffer_index >= 0)
        io_uring_prep_write_fixed(sqe, r.fd, r.buffer, static_cast<unsigned>(r.bytes), r.offset, r.fixed_buffer_index);
      else
        io_uring_prep_writev(sqe, r.fd, &s.iov, 1, r.offset);
      break;
    case IoOp::Fsync:
      io_uring_prep_fsync(sqe, r.fd, r.datasync ? IORING_FSYNC_DATASYNC : 0);
      break;
  }
  io_uring_sqe_set_data64(sqe, slot);
  ++in_flight_;
  ++queued_;
  return true;
}

int UringEngine::flush() {
  if (queued_ == 0) return 0;
  for (uint32_t attempt = 0;; ++attempt) {
    int rc = io_uring_submit(&ring_);
    if (rc >= 0) {
      queued_ = 0;
      return 0;
    }
    if ((rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) && attempt < io_retries_max) continue;
    return rc;
  }
}

int UringEngine::wait(std::vector<IoCompletion>& ret, unsigned min_complete) {
  assert(min_complete <= in_flight_);
  int rc = flush();
  if (rc < 0) return rc;
  io_uring_cqe* cqe = nullptr;
  if (min_complete > 0) {
    for (uint32_t attempt = 0;; ++attempt) {
      rc = io_uring_wait_cqe_nr(&ring_, &cqe, min_complete);
      if (rc == 0) break;
      if (rc == -EINTR || rc == -EAGAIN) continue;  // a signal is not a failure of the ring
      return rc;
    }
  }
  int count = 0;
  unsigned head;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    uint64_t slot = io_uring_cqe_get_data64(cqe);
    assert(slot < slots_.size());
    ret.push_back(IoCompletion{slots_[slot].tag, cqe->res});
    free_slots_.push_back(static_cast<uint32_t>(slot));
    ++count;
  }
  io_uring_cq_advance(&ring_, count);
  in_flight_ -= count;
  return count;
}

}  // namespace kvpark::disk
