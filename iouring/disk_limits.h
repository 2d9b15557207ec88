// Limits of the disk tier, each with its unit last.
//
// Kept beside the library rather than in proto/limits.h because nothing on the wire
// depends on them; the daemon may move them there when it exposes them as options.
#pragma once

#include <cstdint>

#include "proto/limits.h"

namespace kvpark::disk {

// O_DIRECT granularity we align every offset, length and buffer to. 4 KiB covers every
// logical block size NVMe and ext4/xfs use in practice.
inline constexpr uint64_t io_align_bytes = 4096;

// Ring submission queue depth: operations in flight at once.
inline constexpr uint32_t queue_depth_default = 32;
inline constexpr uint32_t queue_depth_max = 1024;

// Transfer and checksum unit of a new record (one read or write op each).
inline constexpr uint32_t chunk_bytes_default = 1024 * 1024;
inline constexpr uint32_t chunk_bytes_min = 64 * 1024;
inline constexpr uint32_t chunk_bytes_max = 16 * 1024 * 1024;

// The kernel refuses a registered buffer larger than 1 GiB (io_uring rsrc limit).
inline constexpr uint64_t fixed_buffer_bytes_max = 1ull << 30;

// Bounded retries (STYLE.md §5): EINTR/EAGAIN resubmits, and remainder resubmits of a
// short transfer, per operation.
inline constexpr uint32_t io_retries_max = 8;
inline constexpr uint32_t short_transfer_resubmits_max = 4;

// Jobs with an open file at once. Many small spills in parallel let ext4 share journal
// commits among their fsyncs; the queue depth still bounds the operations in flight.
inline constexpr uint32_t spill_jobs_active_max = 16;
inline constexpr uint32_t restore_jobs_active_max = 8;

// Subdirectories the record files fan out into (first byte of the record id).
inline constexpr uint32_t fanout_dirs = 256;

// Largest image one record holds: the largest snapshot plus its extent header and tokens.
inline constexpr uint64_t record_image_bytes_max = limits::snapshot_payload_bytes_max + (64ull << 20);

static_assert(chunk_bytes_min % io_align_bytes == 0 && chunk_bytes_max % io_align_bytes == 0);
static_assert(limits::extent_align_bytes % io_align_bytes == 0,
              "arena extents must be O_DIRECT-aligned so restores land in place");
static_assert(record_image_bytes_max / chunk_bytes_min < (1ull << 32),
              "chunk_count is a u32 in the record header");

}  // namespace kvpark::disk
