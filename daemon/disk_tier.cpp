// Entry <-> record translation and the write budget (see disk_tier.h).
#include "daemon/disk_tier.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>

#include <cassert>
#include <chrono>
#include <cstring>
#include <fstream>

#include "daemon/durable_file.h"
#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

uint64_t unix_usec() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

constexpr uint64_t usec_per_day = 86'400ull * 1'000'000;
constexpr uint64_t disk_capacity_share_of_free_percent = 90;  // leave the file system room

}  // namespace

Hash128 tail_digest(std::span<const int32_t> tail_tokens) {
  if (tail_tokens.empty()) return {};
  const XXH128_hash_t h = XXH3_128bits(tail_tokens.data(), tail_tokens.size_bytes());
  return {h.low64, h.high64};
}

Status DiskTier::open(const DiskTierOptions& options, std::unique_ptr<DiskTier>& ret,
                      disk::RecoveryReport& ret_report, disk::OpenError& ret_error) {
  disk::DiskStoreOptions store_options;
  store_options.directory = options.directory;
  store_options.fixed_buffers = options.fixed_buffers;
  std::unique_ptr<disk::DiskStore> store;
  if (Status s = disk::DiskStore::open(std::move(store_options), store, ret_report, &ret_error);
      s != Status::Ok) {
    return s;
  }
  auto tier = std::unique_ptr<DiskTier>(new DiskTier());
  tier->options_ = options;
  tier->store_ = std::move(store);
  tier->day_ = unix_usec() / usec_per_day;
  tier->load_budget();
  if (tier->options_.capacity_bytes == 0) {
    // Unset: what the tier holds now plus most of the file system's free space.
    struct statvfs fs {};
    if (statvfs(options.directory.c_str(), &fs) == 0) {
      const uint64_t free_bytes = uint64_t{fs.f_bavail} * fs.f_frsize;
      tier->options_.capacity_bytes =
          ret_report.bytes_on_disk + free_bytes / 100 * disk_capacity_share_of_free_percent;
    }
  }
  ret = std::move(tier);
  return Status::Ok;
}

disk::RecordHeader DiskTier::meta_for(const Entry& e, const NamespaceInfo& ns,
                                      uint64_t payload_bytes) const {
  disk::RecordHeader h{};
  h.kind = static_cast<uint8_t>(e.kind);
  h.entry_class = static_cast<uint8_t>(e.entry_class);
  h.evidence = static_cast<uint8_t>(e.evidence);
  h.snapshot_required = ns.geometry.snapshot_required ? 1 : 0;
  h.block_tokens = ns.geometry.block_tokens;
  h.namespace_id = ns.id;
  h.block_payload_bytes = ns.geometry.block_payload_bytes;
  h.chain_tokens = ns.chain_tokens;
  h.token_count = e.kind == EntryKind::Block ? ns.geometry.block_tokens
                                             : static_cast<uint32_t>(e.tail_tokens.size());
  h.key_hash = e.key_hash;
  h.parent_hash = e.kind == EntryKind::Block ? e.parent_hash : Hash128{};
  h.tail_digest = e.kind == EntryKind::Block ? Hash128{} : tail_digest(e.tail_tokens);
  h.position = e.position;
  h.anchor_chunks = e.anchor_chunks;
  h.payload_bytes = payload_bytes;
  h.image_bytes = e.extent_bytes;
  h.creator_session = e.creator_session;
  h.payload_checksum = e.payload_checksum;
  h.hits = e.hits;
  h.created_unix_usec = unix_usec();
  return h;
}

uint64_t DiskTier::spill(const Entry& e, const NamespaceInfo& ns, uint64_t payload_bytes,
                         const uint8_t* image) {
  assert(!read_only() && "spill on a read-only disk tier (a daemon bug)");
  uint64_t job = 0;
  (void)store_->spill(meta_for(e, ns, payload_bytes), image, &job);
  return job;
}

uint64_t DiskTier::restore(const Entry& e, const NamespaceInfo& ns, uint8_t* image) {
  const disk::RecordId id = disk::record_id_for(meta_for(e, ns, 0));
  return store_->restore(id, image, e.extent_bytes);
}

void DiskTier::remove(const Entry& e, const NamespaceInfo& ns) {
  store_->remove(disk::record_id_for(meta_for(e, ns, 0)));
}

bool DiskTier::read_tail_tokens(const disk::RecordInfo& record,
                                std::vector<int32_t>& ret_tokens) const {
  const disk::RecordHeader& h = record.header;
  const disk::RecordLayout layout = disk::record_layout(h.image_bytes, h.checksum_chunk_bytes);
  std::vector<int32_t> tokens(h.token_count);
  const int fd = ::open(store_->record_path(record.id).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const size_t bytes = tokens.size() * sizeof(int32_t);
  const ssize_t n = pread(fd, tokens.data(), bytes,
                          static_cast<off_t>(layout.image_offset + limits::entry_header_bytes));
  ::close(fd);
  if (n != static_cast<ssize_t>(bytes) || tail_digest(tokens) != h.tail_digest) return false;
  ret_tokens = std::move(tokens);
  return true;
}

void DiskTier::roll_day() {
  const uint64_t today = unix_usec() / usec_per_day;
  if (today != day_) {
    day_ = today;
    budget_dirty_ = budget_dirty_ || written_today_bytes_ != 0;
    written_today_bytes_ = 0;
  }
}

std::string DiskTier::budget_path() const {
  return options_.directory + "/written-today";
}

void DiskTier::load_budget() {
  std::ifstream in(budget_path());
  std::string format;
  std::string day_key;
  std::string bytes_key;
  uint64_t day = 0;
  uint64_t bytes = 0;
  if (!std::getline(in, format) || format != disk_budget_format) return;
  if (!(in >> day_key >> day >> bytes_key >> bytes) || day_key != "day" || bytes_key != "bytes")
    return;
  if (day == day_) written_today_bytes_ = bytes;
}

bool DiskTier::save_budget(uint64_t now_usec, bool force) {
  roll_day();
  if (!budget_dirty_ || read_only()) return true;
  if (!force && now_usec - budget_saved_usec_ < limits::disk_budget_save_interval_usec) return true;
  budget_saved_usec_ = now_usec;
  const std::string text = std::string(disk_budget_format) + "\nday " + std::to_string(day_) +
                           "\nbytes " + std::to_string(written_today_bytes_) + "\n";
  const bool saved = replace_file_durably(budget_path(), text);
  budget_dirty_ = !saved;
  return saved;
}

bool DiskTier::budget_allows(uint64_t bytes) {
  roll_day();
  return options_.write_budget_bytes_per_day == 0 ||
         written_today_bytes_ + bytes <= options_.write_budget_bytes_per_day;
}

void DiskTier::charge(uint64_t bytes) {
  roll_day();
  written_today_bytes_ += bytes;
  budget_dirty_ = budget_dirty_ || bytes != 0;
}

}  // namespace kvpark::daemon
