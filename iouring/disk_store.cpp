// DiskStore: public calls queue commands; one worker thread owns the engine, the open
// files and the index, runs jobs as chunked operations and posts completions.
//
// Job lifecycle:
//   restore: open (index says it exists) → read header+table, verify against the index →
//            read chunks (direct into the caller's memory when aligned), verify each → done
//   spill:   create "<id>.<job>.tmp" (O_DIRECT, fallocate) → hash+write each chunk →
//            write header+table → fdatasync → rename over "<id>.kvr" → fsync dir → done
// A failed or cancelled job issues nothing more, waits for its in-flight ops (they may
// still write into the caller's memory), then cleans up (temp unlinked, corrupt record
// unlinked) and completes. Every op completion is classified on purpose (STYLE.md §5).
#include "iouring/disk_store.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "iouring/disk_worker.h"
#include "iouring/store_internal.h"
#include "iouring/uring_engine.h"

namespace kvpark::disk {


namespace internal {
AlignedBuffer::AlignedBuffer(uint64_t bytes, bool zero) : bytes_(align_io(bytes)) {
  data_ = static_cast<uint8_t*>(std::aligned_alloc(io_align_bytes, bytes_));
  assert(data_ != nullptr);
  if (zero) memset(data_, 0, bytes_);
}
AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}
void AlignedBuffer::reset() {
  std::free(data_);
  data_ = nullptr;
  bytes_ = 0;
}
}  // namespace internal

RecordId DiskStore::spill(const RecordHeader& meta, const uint8_t* image, uint64_t* ret_job_id) {
  assert(record_meta_valid(meta) && "spill: invalid record metadata (a daemon bug)");
  assert(!read_only_ && "spill: the store is read-only (a daemon bug)");
  assert(image != nullptr);
  Command cmd{Command::Type::Spill};
  cmd.id = record_id_for(meta);
  cmd.header = meta;
  cmd.src = image;
  cmd.image_bytes = meta.image_bytes;
  ++counters_.spills_queued;
  uint64_t job_id = post(std::move(cmd));
  if (ret_job_id != nullptr) *ret_job_id = job_id;
  return record_id_for(meta);
}

uint64_t DiskStore::restore(RecordId id, uint8_t* image_dest, uint64_t image_bytes) {
  assert(image_dest != nullptr && image_bytes > 0);
  Command cmd{Command::Type::Restore};
  cmd.id = id;
  cmd.dest = image_dest;
  cmd.image_bytes = image_bytes;
  ++counters_.restores_queued;
  return post(std::move(cmd));
}

void DiskStore::remove(RecordId id) {
  if (read_only_) return;
  Command cmd{Command::Type::Remove};
  cmd.id = id;
  post(std::move(cmd));
}

uint64_t DiskStore::post(Command&& cmd) {
  std::lock_guard lock(mutex_);
  assert(!stopping_ && "call after shutdown");
  cmd.job_id = next_job_id_++;
  uint64_t job_id = cmd.job_id;
  worker_->inbox.push_back(std::move(cmd));
  wake_.notify_one();
  return job_id;
}

size_t DiskStore::take_completions(std::vector<DiskCompletion>& ret) {
  uint64_t drained;
  while (read(event_fd_, &drained, sizeof drained) > 0) {
  }
  std::lock_guard lock(mutex_);
  size_t n = completions_.size();
  ret.insert(ret.end(), completions_.begin(), completions_.end());
  completions_.clear();
  return n;
}

void DiskStore::complete(std::vector<DiskCompletion>&& done) {
  if (done.empty()) return;
  {
    std::lock_guard lock(mutex_);
    completions_.insert(completions_.end(), done.begin(), done.end());
  }
  done.clear();
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(event_fd_, &one, sizeof one);
}

DiskStats DiskStore::stats() const {
  const Counters& k = counters_;
  return DiskStats{k.bytes_written, k.bytes_read, k.records, k.bytes_on_disk, k.checksum_failures, k.io_errors,
                   k.enospc, k.spills_completed, k.spills_failed, k.restores_completed, k.restores_failed,
                   k.spills_queued, k.restores_queued, k.ops_in_flight};
}

std::string DiskStore::record_path(const RecordId& id) const { return worker_ ? worker_->path_of(id) : std::string(); }

void DiskStore::shutdown(bool drain) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    drain_ = drain;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

DiskStore::~DiskStore() {
  shutdown(false);
  worker_.reset();
  if (event_fd_ >= 0) close(event_fd_);
}

// ---- open -----------------------------------------------------------------------

namespace {
Status status_for_errno(int e) {
  switch (e) {
    case ENOENT: return Status::NotFound;
    case EACCES:
    case EPERM:
    case EROFS: return Status::PermissionDenied;
    case ENOTDIR:
    case EINVAL: return Status::InvalidArgument;
    default: return Status::IoError;
  }
}

Status fail_open(OpenError* ret_error, int e, std::string detail) {
  if (ret_error != nullptr) *ret_error = OpenError{e, std::move(detail)};
  return status_for_errno(e);
}

// Creates and writes one aligned block with O_DIRECT: proves the directory is writable
// and the file system supports O_DIRECT (tmpfs before Linux 6.6, overlay setups do not).
Status probe_direct_io(const std::string& dir, OpenError* ret_error) {
  std::string path = dir + "/.odirect-probe" + internal::temp_suffix;
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    int e = errno;
    if (e == EINVAL) return fail_open(ret_error, e, "directory " + dir + ": the file system does not support O_DIRECT");
    return fail_open(ret_error, e, "directory " + dir + ": cannot create files: " + strerror(e));
  }
  AlignedBuffer block(io_align_bytes);
  ssize_t n = pwrite(fd, block.data(), io_align_bytes, 0);
  int e = errno;
  close(fd);
  unlink(path.c_str());
  if (n != static_cast<ssize_t>(io_align_bytes)) {
    if (n >= 0) e = EIO;
    if (e == EINVAL) return fail_open(ret_error, e, "directory " + dir + ": the file system does not support O_DIRECT");
    return fail_open(ret_error, e, "directory " + dir + ": O_DIRECT write failed: " + strerror(e));
  }
  return Status::Ok;
}
}  // namespace

Status DiskStore::open(DiskStoreOptions options, std::unique_ptr<DiskStore>& ret, RecoveryReport& ret_report,
                       OpenError* ret_error) {
  auto start = std::chrono::steady_clock::now();
  const std::string& dir = options.directory;
  uint32_t cb = options.chunk_bytes;
  if (dir.empty() || options.queue_depth < 1 || options.queue_depth > queue_depth_max || cb < chunk_bytes_min ||
      cb > chunk_bytes_max || (cb & (cb - 1)) != 0)
    return fail_open(ret_error, EINVAL, "invalid disk store options (directory, queue depth or chunk size)");
  options.spill_ops_while_restoring = std::clamp(options.spill_ops_while_restoring, 1u, options.queue_depth);

  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return fail_open(ret_error, errno, "directory " + dir + ": " + strerror(errno));
    if (mkdir(dir.c_str(), 0750) != 0) {
      int e = errno;
      if (e == ENOENT) return fail_open(ret_error, e, "directory " + dir + ": parent directory does not exist");
      return fail_open(ret_error, e, "directory " + dir + ": cannot create: " + strerror(e));
    }
  } else if (!S_ISDIR(st.st_mode)) {
    return fail_open(ret_error, ENOTDIR, "directory " + dir + ": exists and is not a directory");
  }
  RecoveryReport report;
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    const int e = errno;
    // Readable but not writable: serve what is there, write nothing.
    if ((e != EACCES && e != EPERM && e != EROFS) || access(dir.c_str(), R_OK | X_OK) != 0)
      return fail_open(ret_error, e, "directory " + dir + ": not writable: " + strerror(e));
    report.read_only = true;
  }
  Status status = Status::Ok;
  if (!report.read_only) {
    status = probe_direct_io(dir, ret_error);
    if (status != Status::Ok) return status;
    for (uint32_t d = 0; d < fanout_dirs; ++d) {
      std::string sub = dir + "/" + internal::fanout_dir_name(d);
      if (mkdir(sub.c_str(), 0750) != 0 && errno != EEXIST)
        return fail_open(ret_error, errno, "directory " + sub + ": cannot create: " + strerror(errno));
    }
  }

  std::unique_ptr<IoEngine> engine = std::move(options.engine);
  if (!engine) {
    std::unique_ptr<UringEngine> uring;
    std::string why;
    if (UringEngine::create(options.queue_depth, uring, why) != Status::Ok) {
      if (ret_error != nullptr) *ret_error = OpenError{0, why};
      return Status::Unavailable;
    }
    report.engine_notes = uring->probe().missing;
    if (!options.fixed_buffers.empty()) {
      std::string reason;
      report.fixed_buffers_registered = uring->register_buffers(options.fixed_buffers, reason);
      if (!report.fixed_buffers_registered) report.engine_notes.push_back(reason);
    }
    engine = std::move(uring);
  }

  std::unique_ptr<DiskStore> store(new DiskStore());
  store->directory_ = dir;
  store->read_only_ = report.read_only;
  store->worker_ = std::make_unique<Worker>(*store, std::move(engine), options);
  Worker& w = *store->worker_;
  for (uint32_t d = 0; d < fanout_dirs; ++d) {
    std::string sub = dir + "/" + internal::fanout_dir_name(d);
    int fd = ::open(sub.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && report.read_only && errno == ENOENT) {
      w.dir_fds.push_back(-1);  // nothing was ever written there
      continue;
    }
    if (fd < 0) return fail_open(ret_error, errno, "directory " + sub + ": " + strerror(errno));
    w.dir_fds.push_back(fd);
  }
  status = internal::scan_records(dir, *w.engine, w.dir_fds, report.read_only, w.index, report,
                                  ret_error);
  if (status != Status::Ok) return status;
  store->counters_.records = w.index.size();
  store->counters_.bytes_on_disk = report.bytes_on_disk;

  store->event_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (store->event_fd_ < 0) return fail_open(ret_error, errno, std::string("eventfd: ") + strerror(errno));
  store->thread_ = std::thread([s = store.get()] { s->worker_->run(); });
  report.scan_usec = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count());
  ret_report = std::move(report);
  ret = std::move(store);
  return Status::Ok;
}

}  // namespace kvpark::disk
