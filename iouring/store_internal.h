// Internals shared by disk_store.cpp and recovery.cpp; not part of the public API.
#pragma once

#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "iouring/disk_store.h"

namespace kvpark::disk::internal {

// 4 KiB-aligned heap buffer for O_DIRECT staging.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(uint64_t bytes, bool zero = true);
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(AlignedBuffer&& other) noexcept : data_(other.data_), bytes_(other.bytes_) { other.data_ = nullptr; }
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  void reset();

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

using RecordIndex = std::unordered_map<RecordId, RecordInfo, RecordIdHasher>;

inline constexpr const char* record_suffix = ".kvr";
inline constexpr const char* temp_suffix = ".tmp";

std::string fanout_dir_name(uint32_t dir);  // "00".."ff"

// Scans the tree (dir_fds: the open fanout dirs), fills ret_index and the report's counts.
// Uses `engine` (idle, nothing in flight) to read header pages in parallel. read_only:
// removes nothing (temp files and garbage are skipped, not unlinked); a dir fd of -1 is
// a fanout directory that does not exist.
Status scan_records(const std::string& directory, IoEngine& engine, const std::vector<int>& dir_fds,
                    bool read_only, RecordIndex& ret_index, RecoveryReport& report, OpenError* ret_error);

}  // namespace kvpark::disk::internal
