// DiskStore's worker: the job, operation and command types and the worker thread's
// state, shared by disk_store.cpp (the public calls, open) and disk_worker.cpp (the
// thread). Private to iouring/.
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "iouring/disk_store.h"
#include "iouring/io_engine.h"
#include "iouring/store_internal.h"

namespace kvpark::disk {

using internal::AlignedBuffer;

struct DiskStore::Command {
  enum class Type : uint8_t { Spill, Restore, Remove } type;
  uint64_t job_id = 0;
  RecordId id;
  RecordHeader header{};
  const uint8_t* src = nullptr;
  uint8_t* dest = nullptr;
  uint64_t image_bytes = 0;
};

struct DiskStore::Job {
  enum class Phase : uint8_t { Meta, Image, Sync, DirSyncPending, DirSync, Done };
  uint64_t job_id = 0;
  bool spill = false;
  RecordId id;
  RecordHeader header{};  // spill: prepared, sealed once all chunks are hashed; restore: from the index
  const uint8_t* src = nullptr;
  uint8_t* dest = nullptr;
  uint64_t image_bytes = 0;
  uint64_t file_bytes = 0;
  RecordLayout layout{};
  int fd = -1;
  std::string temp_path;
  std::string final_path;
  AlignedBuffer meta;  // header page + chunk table
  Phase phase = Phase::Meta;
  uint32_t next_chunk = 0;
  uint32_t chunks_done = 0;
  bool meta_issued = false;
  unsigned in_flight = 0;
  bool failed = false;
  Status status = Status::Ok;
  int err = 0;
  uint64_t* table() const { return reinterpret_cast<uint64_t*>(meta.data() + record_header_page_bytes); }
};

struct DiskStore::Op {
  enum class Kind : uint8_t { MetaRead, ChunkRead, ChunkWrite, MetaWrite, Sync, DirSync };
  Job* job = nullptr;
  Kind kind = Kind::MetaRead;
  uint32_t chunk = 0;
  uint8_t* buffer = nullptr;  // where the transfer starts (caller memory or bounce)
  uint64_t bytes = 0;         // whole transfer, padded
  uint64_t offset = 0;        // in the file
  uint64_t done = 0;
  uint64_t image_len = 0;     // image bytes this chunk holds (<= bytes)
  uint32_t retries = 0;
  uint32_t resubmits = 0;
  int fd = -1;
  AlignedBuffer bounce;
};

struct DiskStore::Worker {
  DiskStore& store;
  std::unique_ptr<IoEngine> engine;
  uint32_t chunk_bytes;
  uint32_t spill_share;
  bool preallocate;
  std::vector<int> dir_fds;
  internal::RecordIndex index;
  std::deque<Command> inbox;  // guarded by store.mutex_
  std::deque<std::unique_ptr<Job>> restore_wait, spill_wait;
  std::vector<std::unique_ptr<Job>> restore_active, spill_active;
  std::vector<Op> ops;
  std::vector<uint32_t> free_ops;
  unsigned spill_ops_in_flight = 0;
  std::vector<DiskCompletion> done;
  Counters& c;

  Worker(DiskStore& s, std::unique_ptr<IoEngine> e, const DiskStoreOptions& o)
      : store(s), engine(std::move(e)), chunk_bytes(o.chunk_bytes), spill_share(o.spill_ops_while_restoring),
        preallocate(o.preallocate), c(s.counters_) {
    ops.resize(engine->queue_depth());
    for (uint32_t i = static_cast<uint32_t>(ops.size()); i > 0; --i) free_ops.push_back(i - 1);
  }
  ~Worker() {
    for (int fd : dir_fds) close(fd);
  }

  bool idle() const { return restore_wait.empty() && spill_wait.empty() && restore_active.empty() && spill_active.empty(); }
  bool restores_pending() const { return !restore_wait.empty() || !restore_active.empty(); }

  std::string path_of(const RecordId& id, const char* suffix_extra = nullptr) const {
    std::string p = store.directory_ + "/" + internal::fanout_dir_name(record_fanout_dir(id)) + "/" + record_id_hex(id);
    return suffix_extra ? p + suffix_extra : p + internal::record_suffix;
  }

  void run();
  void accept(Command& cmd);
  void cancel_all();
  void start_restore(std::unique_ptr<Job> job);
  void start_spill(std::unique_ptr<Job> job);
  bool issue_one(Job& job);
  void submit_op(Job& job, Op::Kind kind, uint32_t chunk, uint8_t* buffer, uint64_t bytes, uint64_t offset,
                 uint64_t image_len, AlignedBuffer bounce, int fd);
  void resubmit(uint32_t tag);
  void handle(const IoCompletion& completion);
  void transfer_done(Op& op);
  void release(uint32_t tag);
  void fail(Job& job, Status status, int err);
  void fail_io(Job& job, int err);
  bool finished(const Job& job) const;
  void retire(std::unique_ptr<Job> job);
  void finish_unstarted(std::unique_ptr<Job> job, Status status, int err);
  void forget(const RecordId& id);
};

// ---- public API -----------------------------------------------------------------

}  // namespace kvpark::disk
