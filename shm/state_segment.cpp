// The state segment (see state_segment.h and state_format.h for the crash rule).
#include "shm/state_segment.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <atomic>
#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <utility>

#include "proto/xxh3.h"
#include "shm/arena.h"
#include "shm/arena_format.h"
#include "shm/mapping.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22  // Linux 5.14
#endif

namespace kvpark::shm {
namespace {

constexpr uint64_t page_bytes = 4096;

uint64_t page_align(uint64_t bytes) {
  return (bytes + page_bytes - 1) / page_bytes * page_bytes;
}

uint64_t header_checksum(const StateHeader& h) {
  return XXH3_64bits(&h, offsetof(StateHeader, checksum));
}

template <typename T>
uint64_t checksum_after(const T& record, size_t offset) {
  return XXH3_64bits(reinterpret_cast<const uint8_t*>(&record) + offset, sizeof(T) - offset);
}

// The last store of a write and the first of a clear: one aligned 8-byte store,
// which no kill can tear, ordered against the plain stores around it.
void store_word(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_seq_cst);
}
uint64_t load_word(const uint64_t& word) {
  return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(std::memory_order_acquire);
}

uint32_t upgrade_check(uint64_t sequence, uint64_t low) {
  const uint64_t words[2] = {sequence, low};
  return static_cast<uint32_t>(XXH3_64bits(words, sizeof words));
}

uint64_t now_unix_usec() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint64_t state_huge_segment_bytes(uint64_t bytes) {
  return (bytes + state_huge_page_bytes - 1) / state_huge_page_bytes * state_huge_page_bytes;
}

uint64_t state_segment_bytes(uint64_t record_capacity) {
  return state_header_bytes + state_hints_bytes +
         page_align(limits::namespaces_max * sizeof(NamespaceRecord)) +
         page_align(limits::connections_max * sizeof(uint64_t)) +
         page_align(record_capacity * sizeof(StateRecord));
}

void StateSegment::place() {
  namespaces_offset_ = state_header_bytes + state_hints_bytes;
  connections_offset_ =
      namespaces_offset_ + page_align(header_.namespace_capacity * sizeof(NamespaceRecord));
  records_offset_ =
      connections_offset_ + page_align(header_.connection_capacity * sizeof(uint64_t));
}

Status StateSegment::map(int fd, uint64_t bytes, bool transparent, int& ret_errno) {
  struct statfs fs {};
  const bool hugetlb = fstatfs(fd, &fs) == 0 && fs.f_type == HUGETLBFS_MAGIC;
  // On shmem with huge pages allowed, 2 MiB-aligned and advised, as the arena: where
  // shmem_enabled gives them, a restarted daemon reads the records through a new
  // mapping a fault per 2 MiB, not per 4 KiB (hugetlbfs aligns by itself).
  const bool aligned = transparent && !hugetlb;
  void* m = aligned ? map_aligned(fd, bytes, transparent_huge_page_bytes, PROT_READ | PROT_WRITE, 0)
                    : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED || m == nullptr) {
    ret_errno = errno;
    return Status::IoError;
  }
  fd_ = fd;
  base_ = static_cast<uint8_t*>(m);
  bytes_ = bytes;
  on_huge_pages_ = hugetlb;
  if (aligned) {
    (void)madvise(base_, bytes_, MADV_HUGEPAGE);
    (void)*static_cast<volatile uint8_t*>(base_);  // the header's page, as the kernel gives it
    on_transparent_pages_ = shmem_pmd_mapped_bytes(base_) > 0;
  }
  return Status::Ok;
}

namespace {

// A new segment object of `bytes` mapped into `segment`: a memfd (`memfd_flags`), sealed
// against resizing, or with `directory` an unnamed file of that tmpfs (which cannot be
// sealed); false (errno set) otherwise.
bool make_segment_object(StateSegment& segment, unsigned int memfd_flags,
                         const std::string& directory, uint64_t bytes, bool transparent,
                         int& ret_errno, Status (StateSegment::*map)(int, uint64_t, bool, int&)) {
  const bool memfd = directory.empty();
  int fd = memfd ? memfd_create("kvparkd-state", MFD_CLOEXEC | MFD_ALLOW_SEALING | memfd_flags)
                 : create_tmpfs_file(directory);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      (memfd && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) ||
      (segment.*map)(fd, bytes, transparent, ret_errno) != Status::Ok) {
    ret_errno = errno;
    if (fd >= 0) close(fd);
    return false;
  }
  return true;
}

}  // namespace

Status StateSegment::create(const StateLayout& layout, std::unique_ptr<StateSegment>& ret_segment,
                            int& ret_errno, const std::string& directory) {
  const uint64_t capacity = state_record_capacity_for(layout.arena_data_bytes);
  const uint64_t bytes = state_segment_bytes(capacity);
  auto segment = std::unique_ptr<StateSegment>(new StateSegment());
  // With huge pages allowed, on reserved huge pages (vm.nr_hugepages) when they have
  // room for it: a restarted daemon reads every record, and on 4 KiB pages the first
  // read of each page through a new mapping costs more than the read (a few
  // microseconds each on some VMs: docs/operations.md). The mapping reserves its pages.
  // Otherwise shmem, sparse: pages are allocated as records are written, lowest indexes
  // first; with huge pages allowed, in whole 2 MiB pages where shmem_enabled gives them.
  const bool allowed = layout.huge_pages != static_cast<uint16_t>(HugePages::Off);
  const uint64_t shmem_bytes = allowed ? state_huge_segment_bytes(bytes) : bytes;
  auto make = [&](unsigned int memfd_flags, const std::string& in) {
    return make_segment_object(*segment, memfd_flags, in, shmem_bytes, allowed, ret_errno,
                               &StateSegment::map);
  };
  const bool made = (allowed && make(MFD_HUGETLB, {})) ||
                    (!directory.empty() && make(0, directory)) || make(0, {});
  if (!made) return Status::IoError;
  StateHeader& h = segment->header_;
  h = StateHeader{};
  h.magic = state_magic;
  h.format_version = state_format_version;
  h.arena_format_version = arena_format_version;
  h.entry_format_version = entry_format_version;
  h.huge_pages = layout.huge_pages;
  h.record_bytes = sizeof(StateRecord);
  h.arena_identity = layout.arena_identity;
  h.arena_data_bytes = layout.arena_data_bytes;
  h.configured_arena_bytes = layout.configured_arena_bytes;
  h.record_capacity = capacity;
  h.namespace_capacity = limits::namespaces_max;
  h.connection_capacity = limits::connections_max;
  h.created_unix_usec = now_unix_usec();
  h.checksum = header_checksum(h);
  std::memcpy(segment->base_, &h, sizeof h);
  segment->place();
  ret_segment = std::move(segment);
  return Status::Ok;
}

Status StateSegment::adopt(int fd, std::unique_ptr<StateSegment>& ret_segment, int& ret_errno) {
  struct stat st {};
  StateHeader h{};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < state_header_bytes ||
      pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    ret_errno = errno;
    close(fd);
    return Status::Corrupt;
  }
  const bool ok = h.magic == state_magic && h.format_version >= state_format_oldest_adopted &&
                  h.format_version <= state_format_version && h.checksum == header_checksum(h) &&
                  h.record_bytes == sizeof(StateRecord) &&
                  h.namespace_capacity == limits::namespaces_max &&
                  h.connection_capacity == limits::connections_max &&
                  h.record_capacity == state_record_capacity_for(h.arena_data_bytes) &&
                  (static_cast<uint64_t>(st.st_size) == state_segment_bytes(h.record_capacity) ||
                   static_cast<uint64_t>(st.st_size) ==
                       state_huge_segment_bytes(state_segment_bytes(h.record_capacity)));
  if (!ok) {
    ret_errno = 0;
    close(fd);
    return Status::Corrupt;
  }
  auto segment = std::unique_ptr<StateSegment>(new StateSegment());
  const bool transparent = h.huge_pages != static_cast<uint16_t>(HugePages::Off);
  if (Status s = segment->map(fd, static_cast<uint64_t>(st.st_size), transparent, ret_errno);
      s != Status::Ok) {
    close(fd);
    return s;
  }
  segment->header_ = h;
  segment->place();
  ret_segment = std::move(segment);
  return Status::Ok;
}

StateSegment::~StateSegment() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (fd_ >= 0) close(fd_);
}

uint64_t StateSegment::records_high_water() const {
  const uint64_t mark = load_word(hints()->records_high_water);
  return mark < record_capacity() ? mark : record_capacity();
}

void StateSegment::write_record(uint64_t index, const StateRecordBody& body, uint64_t hits,
                                uint64_t last_use_usec) {
  write(index, body, hits, last_use_usec, state_record_valid);
}

void StateSegment::write_reservation(uint64_t index, const StateRecordBody& body) {
  write(index, body, 0, 0, state_reservation_valid);
}

void StateSegment::write(uint64_t index, const StateRecordBody& body, uint64_t hits,
                         uint64_t last_use_usec, uint64_t valid_word) {
  assert(index < record_capacity());
  if (index >= records_high_water()) store_word(hints()->records_high_water, index + 1);
  StateRecord& r = records()[index];
  store_word(r.valid, 0);  // a record being rewritten is invalid until whole again
  r.body = body;
  r.body.sequence = ++sequence_;
  r.checksum = XXH3_64bits(&r.body, sizeof r.body);
  const uint64_t low = uint64_t{body.entry_class} | uint64_t{body.evidence} << 8;
  r.upgrade = low | uint64_t{upgrade_check(r.body.sequence, low)} << 32;
  r.hits = hits;
  r.last_use_usec = last_use_usec;
  store_word(r.valid, valid_word);
}

void StateSegment::clear_record(uint64_t index) {
  assert(index < record_capacity());
  store_word(records()[index].valid, 0);
}

void StateSegment::write_upgrade(uint64_t index, uint8_t entry_class, uint8_t evidence,
                                 bool pinned) {
  StateRecord& r = records()[index];
  const uint64_t low = uint64_t{entry_class} | uint64_t{evidence} << 8 | uint64_t{pinned} << 16;
  store_word(r.upgrade, low | uint64_t{upgrade_check(r.body.sequence, low)} << 32);
}

void StateSegment::write_use(uint64_t index, uint64_t hits, uint64_t last_use_usec) {
  StateRecord& r = records()[index];
  r.hits = hits;
  r.last_use_usec = last_use_usec;
}

StateSegment::RecordCheck StateSegment::check(const StateRecord& record) {
  if (record.valid == 0) return RecordCheck::Empty;
  if ((record.valid != state_record_valid && record.valid != state_reservation_valid) ||
      record.checksum != XXH3_64bits(&record.body, sizeof record.body)) {
    return RecordCheck::Damaged;
  }
  return record.valid == state_record_valid ? RecordCheck::Valid : RecordCheck::Reservation;
}

StateSegment::RecordCheck StateSegment::check_record(uint64_t index,
                                                     StateRecord& ret_record) const {
  assert(index < record_capacity());
  const uint64_t valid = load_word(records()[index].valid);  // ordered before the rest
  StateRecord copy;
  std::memcpy(&copy, &records()[index], sizeof copy);
  copy.valid = valid;
  const RecordCheck result = check(copy);
  if (result == RecordCheck::Valid || result == RecordCheck::Reservation) ret_record = copy;
  return result;
}

RecordsToAdopt::RecordsToAdopt(RecordsToAdopt&& other) noexcept
    : view_(std::exchange(other.view_, nullptr)),
      view_bytes_(std::exchange(other.view_bytes_, 0)),
      records_(std::exchange(other.records_, {})) {}

RecordsToAdopt& RecordsToAdopt::operator=(RecordsToAdopt&& other) noexcept {
  if (this != &other) {
    if (view_ != nullptr) munmap(view_, view_bytes_);
    view_ = std::exchange(other.view_, nullptr);
    view_bytes_ = std::exchange(other.view_bytes_, 0);
    records_ = std::exchange(other.records_, {});
  }
  return *this;
}

RecordsToAdopt::~RecordsToAdopt() {
  if (view_ != nullptr) munmap(view_, view_bytes_);
}

RecordsToAdopt StateSegment::records_to_adopt() const {
  RecordsToAdopt adopting;
  const uint64_t count = records_high_water();
  if (count == 0) return adopting;
  // The whole segment, so that the records lie at the offsets they have in base_ and
  // a huge-page segment is mapped in whole pages (hugetlbfs aligns by itself).
  uint8_t* view = on_transparent_pages_
                      ? map_aligned(fd_, bytes_, transparent_huge_page_bytes, PROT_READ, 0)
                      : static_cast<uint8_t*>(mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd_, 0));
  if (view == MAP_FAILED) view = nullptr;
  if (view != nullptr && on_transparent_pages_) (void)madvise(view, bytes_, MADV_HUGEPAGE);
  uint8_t* const base = view != nullptr ? view : base_;
  // Best effort: a kernel without it faults the pages in as they are read.
  const uint64_t begin = records_offset_ / page_bytes * page_bytes;
  const uint64_t end = page_align(records_offset_ + count * sizeof(StateRecord));
  (void)madvise(base + begin, end - begin, MADV_POPULATE_READ);
  adopting.view_ = view;
  adopting.view_bytes_ = view != nullptr ? bytes_ : 0;
  adopting.records_ = {reinterpret_cast<const StateRecord*>(base + records_offset_),
                       static_cast<size_t>(count)};
  return adopting;
}

bool StateSegment::upgraded(const StateRecord& record, uint8_t& ret_class, uint8_t& ret_evidence,
                            bool& ret_pinned) {
  const uint64_t low = record.upgrade & 0xffffffffu;
  const bool held =
      (record.upgrade >> 32) == upgrade_check(record.body.sequence, low) && (low >> 17) == 0;
  ret_class = held ? static_cast<uint8_t>(low & 0xff) : record.body.entry_class;
  ret_evidence = held ? static_cast<uint8_t>((low >> 8) & 0xff) : record.body.evidence;
  ret_pinned = held && ((low >> 16) & 1) != 0;
  return held;
}

void StateSegment::write_namespace(uint32_t index, const NamespaceRecord& record) {
  assert(index < header_.namespace_capacity);
  NamespaceRecord& r = namespaces()[index];
  store_word(r.valid, 0);
  std::memcpy(reinterpret_cast<uint8_t*>(&r) + 16, reinterpret_cast<const uint8_t*>(&record) + 16,
              sizeof r - 16);
  r.checksum = checksum_after(r, 16);
  store_word(r.valid, state_namespace_valid);
}

void StateSegment::clear_namespace(uint32_t index) {
  assert(index < header_.namespace_capacity);
  store_word(namespaces()[index].valid, 0);
}

bool StateSegment::namespace_valid(uint32_t index, NamespaceRecord& ret_record) const {
  assert(index < header_.namespace_capacity);
  NamespaceRecord copy;
  std::memcpy(&copy, &namespaces()[index], sizeof copy);
  if (copy.valid != state_namespace_valid || copy.checksum != checksum_after(copy, 16))
    return false;
  ret_record = copy;
  return true;
}

void StateSegment::set_connection(uint32_t slot, uint32_t pid) {
  assert(slot < header_.connection_capacity && pid != 0);
  store_word(connections()[slot], uint64_t{pid} << 32 | state_connection_tag);
}

void StateSegment::clear_connection(uint32_t slot) {
  assert(slot < header_.connection_capacity);
  store_word(connections()[slot], 0);
}

uint32_t StateSegment::connection_pid(uint32_t slot) const {
  assert(slot < header_.connection_capacity);
  const uint64_t word = load_word(connections()[slot]);
  return (word & 0xffffffffu) == state_connection_tag ? static_cast<uint32_t>(word >> 32) : 0;
}

}  // namespace kvpark::shm
