// DiskStore's worker thread (see disk_store.cpp for the job lifecycle): it owns the
// engine, the open files and the index, runs jobs as chunked operations, classifies
// every completion on purpose (STYLE.md §5) and posts DiskCompletions.
#include "iouring/disk_worker.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace kvpark::disk {

void DiskStore::Worker::run() {
  std::vector<IoCompletion> completions;
  for (;;) {
    std::deque<Command> commands;
    bool stopping, drain;
    {
      std::unique_lock lock(store.mutex_);
      if (idle() && engine->in_flight() == 0)
        store.wake_.wait(lock, [&] { return !inbox.empty() || store.stopping_; });
      commands.swap(inbox);
      stopping = store.stopping_;
      drain = store.drain_;
    }
    for (Command& cmd : commands) accept(cmd);
    if (stopping && !drain) cancel_all();

    while (!restore_wait.empty() && restore_active.size() < restore_jobs_active_max) {
      auto job = std::move(restore_wait.front());
      restore_wait.pop_front();
      start_restore(std::move(job));
    }
    while (!spill_wait.empty() && spill_active.size() < spill_jobs_active_max) {
      auto job = std::move(spill_wait.front());
      spill_wait.pop_front();
      start_spill(std::move(job));
    }

    // Restores first; spills keep a small share while any restore is pending.
    for (auto& job : restore_active)
      while (engine->in_flight() < engine->queue_depth() && issue_one(*job)) {
      }
    unsigned spill_cap = restores_pending() ? spill_share : engine->queue_depth();
    for (auto& job : spill_active)
      while (engine->in_flight() < engine->queue_depth() && spill_ops_in_flight < spill_cap && issue_one(*job)) {
      }

    for (auto* active : {&restore_active, &spill_active}) {
      for (size_t i = 0; i < active->size();) {
        if (finished(*(*active)[i])) {
          auto job = std::move((*active)[i]);
          active->erase(active->begin() + static_cast<long>(i));
          retire(std::move(job));
        } else {
          ++i;
        }
      }
    }
    store.complete(std::move(done));
    c.ops_in_flight = engine->in_flight();

    if (engine->in_flight() == 0) {
      if (idle() && stopping) return;
      // Every active job either issued an op or finished above; new jobs may have arrived.
      continue;
    }
    completions.clear();
    int rc = engine->wait(completions, 1);
    assert(rc >= 0 && "io_uring wait failed: the ring itself is broken");
    (void)rc;
    for (const IoCompletion& completion : completions) handle(completion);
  }
}

void DiskStore::Worker::accept(Command& cmd) {
  if (cmd.type == Command::Type::Remove) {
    auto superseded = [&](const std::unique_ptr<Job>& j) { return j->id == cmd.id; };
    for (auto it = spill_wait.begin(); it != spill_wait.end();) {
      if (superseded(*it)) {
        finish_unstarted(std::move(*it), Status::NotFound, ECANCELED);
        it = spill_wait.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& job : spill_active)
      if (superseded(job) && job->phase < Job::Phase::DirSyncPending) fail(*job, Status::NotFound, ECANCELED);
    std::string path = path_of(cmd.id);
    unlink(path.c_str());
    forget(cmd.id);
    return;
  }
  auto job = std::make_unique<Job>();
  job->job_id = cmd.job_id;
  job->id = cmd.id;
  job->spill = cmd.type == Command::Type::Spill;
  job->header = cmd.header;
  job->src = cmd.src;
  job->dest = cmd.dest;
  job->image_bytes = cmd.image_bytes;
  job->final_path = path_of(cmd.id);
  (job->spill ? spill_wait : restore_wait).push_back(std::move(job));
}

void DiskStore::Worker::cancel_all() {
  for (auto* wait : {&restore_wait, &spill_wait}) {
    for (auto& job : *wait) finish_unstarted(std::move(job), Status::Unavailable, ECANCELED);
    wait->clear();
  }
  for (auto& job : restore_active) fail(*job, Status::Unavailable, ECANCELED);
  for (auto& job : spill_active)
    if (job->phase < Job::Phase::DirSyncPending) fail(*job, Status::Unavailable, ECANCELED);
}

void DiskStore::Worker::forget(const RecordId& id) {
  auto it = index.find(id);
  if (it == index.end()) return;
  c.bytes_on_disk -= it->second.file_bytes;
  index.erase(it);
  c.records = index.size();
}

void DiskStore::Worker::finish_unstarted(std::unique_ptr<Job> job, Status status, int err) {
  job->failed = true;
  job->status = status;
  job->err = err;
  retire(std::move(job));
}

void DiskStore::Worker::start_restore(std::unique_ptr<Job> job) {
  auto it = index.find(job->id);
  if (it == index.end()) return finish_unstarted(std::move(job), Status::NotFound, ENOENT);
  if (it->second.header.image_bytes != job->image_bytes)
    return finish_unstarted(std::move(job), Status::InvalidArgument, EINVAL);
  job->header = it->second.header;
  job->file_bytes = it->second.file_bytes;
  job->layout = record_layout(job->header.image_bytes, job->header.checksum_chunk_bytes);
  job->fd = ::open(job->final_path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (job->fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      forget(job->id);
      return finish_unstarted(std::move(job), Status::NotFound, e);
    }
    ++c.io_errors;
    return finish_unstarted(std::move(job), Status::IoError, e);
  }
  struct stat st;
  if (fstat(job->fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != job->file_bytes) {
    ++c.checksum_failures;  // truncated or grown behind our back
    return finish_unstarted(std::move(job), Status::Corrupt, 0);
  }
  job->meta = AlignedBuffer(job->layout.image_offset, false);
  job->phase = Job::Phase::Meta;
  restore_active.push_back(std::move(job));
}

void DiskStore::Worker::start_spill(std::unique_ptr<Job> job) {
  job->header = prepare_record_header(job->header, chunk_bytes);
  job->layout = record_layout(job->header.image_bytes, job->header.checksum_chunk_bytes);
  job->file_bytes = job->layout.file_bytes;
  job->meta = AlignedBuffer(job->layout.image_offset, true);
  job->temp_path = path_of(job->id, ("." + std::to_string(job->job_id) + internal::temp_suffix).c_str());
  job->fd = ::open(job->temp_path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_DIRECT | O_CLOEXEC, 0640);
  if (job->fd < 0) {
    int e = errno;
    ++c.io_errors;
    if (e == ENOSPC || e == EDQUOT) ++c.enospc;
    job->temp_path.clear();  // nothing to remove
    return finish_unstarted(std::move(job), Status::IoError, e);
  }
  if (preallocate && fallocate(job->fd, 0, 0, static_cast<off_t>(job->file_bytes)) != 0) {
    int e = errno;
    if (e != EOPNOTSUPP && e != ENOSYS) {
      ++c.io_errors;
      if (e == ENOSPC || e == EDQUOT) ++c.enospc;
      return finish_unstarted(std::move(job), Status::IoError, e);
    }
  }
  job->phase = Job::Phase::Image;
  spill_active.push_back(std::move(job));
}

// Submits the job's next operation; false when it has nothing to submit now.
bool DiskStore::Worker::issue_one(Job& job) {
  if (job.failed) return false;
  const RecordHeader& h = job.header;
  if (!job.spill) {
    if (job.phase == Job::Phase::Meta) {
      if (job.meta_issued) return false;
      job.meta_issued = true;
      submit_op(job, Op::Kind::MetaRead, 0, job.meta.data(), job.layout.image_offset, 0, 0, {}, job.fd);
      return true;
    }
    if (job.phase != Job::Phase::Image || job.next_chunk >= h.chunk_count) return false;
    uint32_t i = job.next_chunk++;
    uint64_t off = uint64_t{i} * h.checksum_chunk_bytes;
    uint64_t len = std::min<uint64_t>(h.checksum_chunk_bytes, h.image_bytes - off);
    uint8_t* dest = job.dest + off;
    bool direct = reinterpret_cast<uintptr_t>(dest) % io_align_bytes == 0 && len % io_align_bytes == 0;
    AlignedBuffer bounce = direct ? AlignedBuffer() : AlignedBuffer(len, false);
    uint8_t* buf = direct ? dest : bounce.data();
    submit_op(job, Op::Kind::ChunkRead, i, buf, align_io(len), job.layout.image_offset + off, len, std::move(bounce),
              job.fd);
    return true;
  }

  switch (job.phase) {
    case Job::Phase::Image: {
      if (job.next_chunk < h.chunk_count) {
        uint32_t i = job.next_chunk++;
        uint64_t off = uint64_t{i} * h.checksum_chunk_bytes;
        uint64_t len = std::min<uint64_t>(h.checksum_chunk_bytes, h.image_bytes - off);
        const uint8_t* src = job.src + off;
        job.table()[i] = record_chunk_checksum(src, len);
        bool direct = reinterpret_cast<uintptr_t>(src) % io_align_bytes == 0 && len % io_align_bytes == 0;
        AlignedBuffer bounce = direct ? AlignedBuffer() : AlignedBuffer(len, true);
        if (!direct) memcpy(bounce.data(), src, len);
        uint8_t* buf = direct ? const_cast<uint8_t*>(src) : bounce.data();
        submit_op(job, Op::Kind::ChunkWrite, i, buf, align_io(len), job.layout.image_offset + off, len,
                  std::move(bounce), job.fd);
        return true;
      }
      if (!job.meta_issued) {
        seal_record_header(job.header, job.table());
        check_record_for_write(job.header, job.table());  // pair of check_record_header at read
        memcpy(job.meta.data(), &job.header, sizeof job.header);
        job.meta_issued = true;
        submit_op(job, Op::Kind::MetaWrite, 0, job.meta.data(), job.layout.image_offset, 0, 0, {}, job.fd);
        return true;
      }
      if (job.in_flight > 0) return false;
      job.phase = Job::Phase::Sync;
      submit_op(job, Op::Kind::Sync, 0, nullptr, 0, 0, 0, {}, job.fd);
      return true;
    }
    case Job::Phase::DirSyncPending:
      job.phase = Job::Phase::DirSync;
      submit_op(job, Op::Kind::DirSync, 0, nullptr, 0, 0, 0, {}, dir_fds[record_fanout_dir(job.id)]);
      return true;
    default:
      return false;
  }
}

void DiskStore::Worker::submit_op(Job& job, Op::Kind kind, uint32_t chunk, uint8_t* buffer, uint64_t bytes,
                                  uint64_t offset, uint64_t image_len, AlignedBuffer bounce, int fd) {
  assert(!free_ops.empty());
  uint32_t tag = free_ops.back();
  free_ops.pop_back();
  Op& op = ops[tag];
  op.job = &job;
  op.kind = kind;
  op.chunk = chunk;
  op.buffer = buffer;
  op.bytes = bytes;
  op.offset = offset;
  op.done = 0;
  op.image_len = image_len;
  op.retries = 0;
  op.resubmits = 0;
  op.fd = fd;
  op.bounce = std::move(bounce);
  ++job.in_flight;
  if (job.spill) ++spill_ops_in_flight;
  resubmit(tag);
}

void DiskStore::Worker::resubmit(uint32_t tag) {
  Op& op = ops[tag];
  IoRequest r;
  r.fd = op.fd;
  r.tag = tag;
  if (op.kind == Op::Kind::Sync || op.kind == Op::Kind::DirSync) {
    r.op = IoOp::Fsync;
    r.datasync = op.kind == Op::Kind::Sync;
  } else {
    bool read = op.kind == Op::Kind::MetaRead || op.kind == Op::Kind::ChunkRead;
    r.op = read ? IoOp::Read : IoOp::Write;
    r.buffer = op.buffer + op.done;
    r.bytes = op.bytes - op.done;
    r.offset = op.offset + op.done;
    r.fixed_buffer_index = engine->fixed_buffer_index(r.buffer, r.bytes);
  }
  [[maybe_unused]] bool queued = engine->submit(r);
  assert(queued && "ops never exceed the engine's queue depth");
}

void DiskStore::Worker::release(uint32_t tag) {
  Op& op = ops[tag];
  Job& job = *op.job;
  --job.in_flight;
  if (job.spill) --spill_ops_in_flight;
  op.bounce.reset();
  op.job = nullptr;
  free_ops.push_back(tag);
}

void DiskStore::Worker::fail(Job& job, Status status, int err) {
  if (job.failed) return;
  job.failed = true;
  job.status = status;
  job.err = err;
}

void DiskStore::Worker::fail_io(Job& job, int err) {
  ++c.io_errors;
  if (err == ENOSPC || err == EDQUOT) ++c.enospc;
  fail(job, Status::IoError, err);
}

void DiskStore::Worker::handle(const IoCompletion& completion) {
  uint32_t tag = static_cast<uint32_t>(completion.tag);
  assert(tag < ops.size() && ops[tag].job != nullptr);
  Op& op = ops[tag];
  Job& job = *op.job;
  int64_t res = completion.result;
  if (res < 0) {
    int e = static_cast<int>(-res);
    switch (e) {
      case EINTR:
      case EAGAIN:
        if (op.retries++ < io_retries_max && !job.failed) return resubmit(tag);
        fail_io(job, e);
        break;
      case EFAULT:
      case EBADF:
        assert(false && "EFAULT/EBADF from the ring: a bad buffer or fd is a bug");
        fail_io(job, e);
        break;
      case EIO:
      case ENOSPC:
      case EDQUOT:
      default:  // unexpected errnos (EINVAL: misaligned O_DIRECT) are I/O errors too
        fail_io(job, e);
        break;
    }
    return release(tag);
  }
  if (op.kind == Op::Kind::Sync || op.kind == Op::Kind::DirSync) {
    release(tag);
    if (job.failed) return;
    if (op.kind == Op::Kind::Sync) {
      if (rename(job.temp_path.c_str(), job.final_path.c_str()) != 0) return fail_io(job, errno);
      job.temp_path.clear();
      forget(job.id);
      index[job.id] = RecordInfo{job.id, job.header, job.file_bytes};
      c.bytes_on_disk += job.file_bytes;
      c.records = index.size();
      job.phase = Job::Phase::DirSyncPending;
    } else {
      job.phase = Job::Phase::Done;
    }
    return;
  }
  bool read = op.kind == Op::Kind::MetaRead || op.kind == Op::Kind::ChunkRead;
  op.done += static_cast<uint64_t>(res);
  (read ? c.bytes_read : c.bytes_written) += static_cast<uint64_t>(res);
  if (op.done < op.bytes) {
    if (res == 0) {
      if (read) {  // end of file inside the record: truncated
        ++c.checksum_failures;
        fail(job, Status::Corrupt, 0);
      } else {
        fail_io(job, EIO);
      }
    } else if (op.resubmits++ < short_transfer_resubmits_max && !job.failed) {
      return resubmit(tag);
    } else {
      fail_io(job, EIO);
    }
    return release(tag);
  }
  if (!job.failed) transfer_done(op);
  release(tag);
}

void DiskStore::Worker::transfer_done(Op& op) {
  Job& job = *op.job;
  switch (op.kind) {
    case Op::Kind::MetaRead: {
      RecordHeader on_disk;
      memcpy(&on_disk, job.meta.data(), sizeof on_disk);
      // Pair of check_record_for_write: the header must verify and be the one we indexed.
      if (check_record_header(on_disk, job.file_bytes) != HeaderDefect::None ||
          memcmp(&on_disk, &job.header, sizeof on_disk) != 0 ||
          record_table_checksum(job.table(), on_disk.chunk_count) != on_disk.table_checksum) {
        ++c.checksum_failures;
        return fail(job, Status::Corrupt, 0);
      }
      job.phase = Job::Phase::Image;
      return;
    }
    case Op::Kind::ChunkRead: {
      uint64_t off = uint64_t{op.chunk} * job.header.checksum_chunk_bytes;
      if (op.bounce.data() != nullptr) memcpy(job.dest + off, op.bounce.data(), op.image_len);
      if (record_chunk_checksum(job.dest + off, op.image_len) != job.table()[op.chunk]) {
        ++c.checksum_failures;
        return fail(job, Status::Corrupt, 0);
      }
      ++job.chunks_done;
      return;
    }
    case Op::Kind::ChunkWrite:
      ++job.chunks_done;
      return;
    default:
      return;
  }
}

bool DiskStore::Worker::finished(const Job& job) const {
  if (job.in_flight > 0) return false;
  if (job.failed) return true;
  if (job.spill) return job.phase == Job::Phase::Done;
  return job.phase == Job::Phase::Image && job.chunks_done == job.header.chunk_count;
}

void DiskStore::Worker::retire(std::unique_ptr<Job> job) {
  assert(job->in_flight == 0);
  DiskCompletion out;
  out.job_id = job->job_id;
  out.kind = job->spill ? DiskCompletion::Kind::Spill : DiskCompletion::Kind::Restore;
  out.id = job->id;
  out.status = job->failed ? job->status : Status::Ok;
  out.err = job->failed ? job->err : 0;
  if (job->spill) {
    if (job->failed && !job->temp_path.empty()) unlink(job->temp_path.c_str());
    if (job->failed && job->phase == Job::Phase::DirSync) {
      // Renamed but the directory entry may not be durable: drop it rather than report a
      // record that a crash could lose.
      unlink(job->final_path.c_str());
      forget(job->id);
    }
    out.bytes = job->failed ? 0 : job->file_bytes;
    ++(job->failed ? c.spills_failed : c.spills_completed);
    --c.spills_queued;
  } else {
    if (job->failed && job->status == Status::Corrupt) {
      // Never served again: unlink it, but only if the path still names the file we read.
      struct stat ours, now;
      if (job->fd >= 0 && fstat(job->fd, &ours) == 0 && stat(job->final_path.c_str(), &now) == 0 &&
          ours.st_ino == now.st_ino && ours.st_dev == now.st_dev) {
        unlink(job->final_path.c_str());
        forget(job->id);
      } else if (job->fd < 0) {
        unlink(job->final_path.c_str());
        forget(job->id);
      }
    }
    out.bytes = job->failed ? 0 : job->image_bytes;
    ++(job->failed ? c.restores_failed : c.restores_completed);
    --c.restores_queued;
  }
  if (job->fd >= 0) close(job->fd);
  done.push_back(out);
}

}  // namespace kvpark::disk
