// The daemon's side of the disk tier: translates entries to records and back,
// keeps the daily write budget, and owns the DiskStore (iouring/).
//
// Records are named by their key, so an entry's record is found again from the
// entry alone; the daemon keeps no record ids. Budget accounting is by UTC day, and
// survives restarts: "written today" and its day are kept in `<directory>/written-today`
// (text, versioned, replaced atomically), read at open and saved while it changes
// (limits::disk_budget_save_interval_usec) and at stop. A file of another day, or one
// that does not parse, counts from zero.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "daemon/entry_table.h"
#include "iouring/disk_store.h"

namespace kvpark::daemon {

struct DiskTierOptions {
  std::string directory;
  uint64_t capacity_bytes = 0;              // 0: no limit but the file system
  uint64_t write_budget_bytes_per_day = 0;  // 0: unlimited
  std::vector<iovec> fixed_buffers;         // the arena data region
};

class DiskTier {
 public:
  static Status open(const DiskTierOptions& options, std::unique_ptr<DiskTier>& ret,
                     disk::RecoveryReport& ret_report, disk::OpenError& ret_error);

  // Starts writing an entry's host image; the caller keeps it pinned until completion.
  // `payload_bytes` comes from the image's entry header (the caller checked it).
  uint64_t spill(const Entry& e, const NamespaceInfo& ns, uint64_t payload_bytes,
                 const uint8_t* image);
  // Starts reading an entry's record into its (promoting) extent.
  uint64_t restore(const Entry& e, const NamespaceInfo& ns, uint8_t* image);
  void remove(const Entry& e, const NamespaceInfo& ns);

  // A recovered snapshot's tail tokens, read from its record and checked against
  // the header's digest. False when they cannot be read or do not match.
  bool read_tail_tokens(const disk::RecordInfo& record, std::vector<int32_t>& ret_tokens) const;

  // Daily write budget.
  bool budget_allows(uint64_t bytes);
  void charge(uint64_t bytes);
  uint64_t written_today_bytes() const { return written_today_bytes_; }
  // Saves "written today" when it changed and the last save is older than
  // limits::disk_budget_save_interval_usec (`force`: whenever it changed). False,
  // errno set, when the file cannot be written; true when nothing was due.
  bool save_budget(uint64_t now_usec, bool force);
  std::string budget_path() const;

  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  void set_capacity_bytes(uint64_t bytes) { options_.capacity_bytes = bytes; }
  uint64_t write_budget_bytes_per_day() const { return options_.write_budget_bytes_per_day; }
  void set_write_budget_bytes_per_day(uint64_t bytes) { options_.write_budget_bytes_per_day = bytes; }
  const std::string& directory() const { return options_.directory; }
  // Served read-only (the directory is not writable): restores only, no spills.
  bool read_only() const { return store_->read_only(); }

  disk::DiskStore& store() { return *store_; }

 private:
  disk::RecordHeader meta_for(const Entry& e, const NamespaceInfo& ns, uint64_t payload_bytes) const;
  void roll_day();
  void load_budget();

  DiskTierOptions options_;
  std::unique_ptr<disk::DiskStore> store_;
  uint64_t day_ = 0;  // UTC day number of written_today_bytes_
  uint64_t written_today_bytes_ = 0;
  bool budget_dirty_ = false;       // written_today_bytes_ differs from the saved file
  uint64_t budget_saved_usec_ = 0;  // CLOCK_MONOTONIC of the last save
};

// The budget file's first line; bump the number when the layout changes.
inline constexpr const char* disk_budget_format = "kvpark-disk-written-today 1";

// XXH3-128 of a snapshot's tail token ids (zero for blocks), as records store it.
Hash128 tail_digest(std::span<const int32_t> tail_tokens);

}  // namespace kvpark::daemon
