// DiskStore: the NVMe cold tier. One file per record under a directory it owns, written
// and read by one worker thread through an IoEngine (io_uring), O_DIRECT, in chunks.
//
// Model:
//  - open() creates the tree if missing, checks O_DIRECT works, and recovers by scanning:
//    it indexes every record whose header verifies, removes temp files and garbage, and
//    leaves records of another format version alone (counted, never indexed).
//  - spill()/restore()/remove() only queue a job and return; the worker runs it and posts
//    a DiskCompletion; notify_fd() becomes readable; take_completions() collects them.
//  - A directory the daemon may read but not write (a read-only mount, no write
//    permission) opens read-only: records are indexed and restored, nothing is
//    removed or written (spill() must not be called; remove() does nothing).
//  - Restores go ahead of spills: while a restore is queued or running, spills keep at
//    most spill_ops_while_restoring operations in flight.
//  - A spill is durable when it completes Ok (temp file, fdatasync, rename, directory
//    fsync). A crash at any instant leaves the old record, the new one, or a temp file that
//    recovery removes. A restore completes Ok only when every chunk verified.
// Thread-safe; the public calls never block on I/O.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "iouring/io_engine.h"
#include "iouring/record_format.h"
#include "proto/status.h"

namespace kvpark::disk {

struct DiskStoreOptions {
  std::string directory;                           // created if missing; its parent must exist
  uint32_t queue_depth = queue_depth_default;      // operations in flight
  uint32_t chunk_bytes = chunk_bytes_default;      // transfer and checksum unit, power of two
  uint32_t spill_ops_while_restoring = 1;          // spill ops in flight while a restore is pending (>= 1)
  bool preallocate = true;                         // fallocate a spill's file: ENOSPC before any write
  std::vector<iovec> fixed_buffers;                // memory to register (the arena data region)
  std::unique_ptr<IoEngine> engine;                // null: a UringEngine of queue_depth (tests inject one)
};

struct RecordInfo {
  RecordId id;
  RecordHeader header;
  uint64_t file_bytes = 0;  // bytes the record occupies on disk (apparent size)
};

struct RecoveryReport {
  std::vector<RecordInfo> records;       // indexed: header verified, size consistent
  uint64_t bytes_on_disk = 0;            // sum of records' file_bytes
  uint64_t temp_files_removed = 0;       // interrupted writes
  uint64_t garbage_removed = 0;          // bad magic/checksum/fields/size, or an unknown name
  uint64_t other_version_records = 0;    // left untouched, not indexed
  std::vector<std::string> other_version_paths;  // the first few, for the log line
  uint64_t scan_usec = 0;                // time open() spent scanning
  bool fixed_buffers_registered = false;
  bool read_only = false;                // the directory is not writable: served read-only
  std::vector<std::string> engine_notes;  // what the ring lacks, what fell back
};

// Why open() failed, for the one log line the daemon writes.
struct OpenError {
  int err = 0;         // errno, when a system call failed
  std::string detail;  // "directory /x: parent does not exist", ...
};

struct DiskCompletion {
  enum class Kind : uint8_t { Spill, Restore };
  uint64_t job_id = 0;
  Kind kind = Kind::Spill;
  RecordId id;
  Status status = Status::Ok;  // Ok, NotFound, Corrupt, IoError, InvalidArgument, Unavailable
  int err = 0;                 // errno beside IoError; ECANCELED when cancelled
  uint64_t bytes = 0;          // spill: file_bytes on disk; restore: image bytes restored
};

struct DiskStats {
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;
  uint64_t records = 0;
  uint64_t bytes_on_disk = 0;
  uint64_t checksum_failures = 0;   // restores refused: chunk, table or header mismatch, truncation
  uint64_t io_errors = 0;
  uint64_t enospc = 0;
  uint64_t spills_completed = 0;    // Ok
  uint64_t spills_failed = 0;
  uint64_t restores_completed = 0;  // Ok
  uint64_t restores_failed = 0;
  uint64_t spills_queued = 0;       // waiting or running now
  uint64_t restores_queued = 0;
  uint64_t ops_in_flight = 0;
};

class DiskStore {
 public:
  // Ok; NotFound (parent missing); PermissionDenied (read-only, no access); InvalidArgument
  // (not a directory, no O_DIRECT there, bad options); Unavailable (no io_uring); IoError.
  static Status open(DiskStoreOptions options, std::unique_ptr<DiskStore>& ret, RecoveryReport& ret_report,
                     OpenError* ret_error = nullptr);
  ~DiskStore();  // shutdown(false)
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Writes `image` (meta.image_bytes bytes) as a record; the store fills magic, version,
  // chunking and checksums. `image` must stay valid and unchanged until the completion.
  // Replaces an existing record of the same id atomically. Asserts meta is valid.
  RecordId spill(const RecordHeader& meta, const uint8_t* image, uint64_t* ret_job_id = nullptr);
  // Reads the record's image into image_dest (image_bytes must equal the record's), each
  // chunk verified. Returns the job id.
  uint64_t restore(RecordId id, uint8_t* image_dest, uint64_t image_bytes);
  // Unlinks the record; spills of it queued or running before this call are cancelled
  // (they complete NotFound/ECANCELED) unless they already renamed.
  void remove(RecordId id);

  int notify_fd() const { return event_fd_; }
  size_t take_completions(std::vector<DiskCompletion>& ret);
  DiskStats stats() const;
  // Stops the worker. drain: finish every queued job first; otherwise queued and running
  // jobs complete Unavailable/ECANCELED (running ones after their in-flight ops return).
  void shutdown(bool drain);

  const std::string& directory() const { return directory_; }
  bool read_only() const { return read_only_; }
  std::string record_path(const RecordId& id) const;

 private:
  struct Job;
  struct Op;
  struct Command;
  struct Worker;
  DiskStore() = default;
  uint64_t post(Command&& command);  // returns the job id
  void complete(std::vector<DiskCompletion>&& done);

  std::string directory_;
  bool read_only_ = false;
  int event_fd_ = -1;
  std::unique_ptr<Worker> worker_;
  std::thread thread_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  bool drain_ = false;
  std::vector<DiskCompletion> completions_;
  uint64_t next_job_id_ = 1;

  friend struct Worker;
  struct Counters {
    std::atomic<uint64_t> bytes_written{0}, bytes_read{0}, records{0}, bytes_on_disk{0}, checksum_failures{0},
        io_errors{0}, enospc{0}, spills_completed{0}, spills_failed{0}, restores_completed{0}, restores_failed{0},
        spills_queued{0}, restores_queued{0}, ops_in_flight{0};
  };
  Counters counters_;
};

}  // namespace kvpark::disk
