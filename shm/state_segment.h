// The state segment's memfd, mapped, with the record discipline of state_format.h.
//
// The daemon creates one at a fresh start, or adopts the one the service manager
// kept. Writers go through write_*/clear_*, which keep the crash rule; readers at
// adoption go through the *_valid accessors, which check what they return. Not
// thread-safe: the daemon's event loop owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "proto/status.h"
#include "shm/state_format.h"

namespace kvpark::shm {

struct StateLayout {
  uint64_t arena_identity = 0;
  uint64_t arena_data_bytes = 0;
  uint64_t configured_arena_bytes = 0;
  uint16_t huge_pages = 0;
};

// Records mapped read-only for adoption, unmapped when this goes.
class RecordsToAdopt {
 public:
  RecordsToAdopt() = default;
  RecordsToAdopt(RecordsToAdopt&& other) noexcept;
  RecordsToAdopt& operator=(RecordsToAdopt&& other) noexcept;
  ~RecordsToAdopt();

  std::span<const StateRecord> records() const { return records_; }

 private:
  friend class StateSegment;
  uint8_t* view_ = nullptr;  // nullptr: the records are read through the segment's mapping
  uint64_t view_bytes_ = 0;
  std::span<const StateRecord> records_;
};

class StateSegment {
 public:
  // A new, empty segment for this arena; IoError with ret_errno on failure. With huge
  // pages allowed, on reserved huge pages when there is room; else, when `directory`
  // names a tmpfs, an unnamed file there (create_tmpfs_file(): a mount with huge= gives
  // it 2 MiB pages, and it cannot be sealed as a memfd is); else a sealed memfd.
  static Status create(const StateLayout& layout, std::unique_ptr<StateSegment>& ret_segment,
                       int& ret_errno, const std::string& directory = {});
  // Maps a kept segment (takes the fd, closed on failure). Corrupt when its header
  // fails its checksum, names another format, or the object has the wrong size.
  static Status adopt(int fd, std::unique_ptr<StateSegment>& ret_segment, int& ret_errno);
  ~StateSegment();
  StateSegment(const StateSegment&) = delete;
  StateSegment& operator=(const StateSegment&) = delete;

  int fd() const { return fd_; }
  const StateHeader& header() const { return header_; }
  uint64_t record_capacity() const { return header_.record_capacity; }
  // Records at or past this index were never written (clamped to the capacity).
  uint64_t records_high_water() const;

  // Records. write_record raises the high-water mark first, then writes the body,
  // the checksum and last the valid word; clear_record stores 0 in the valid word.
  void write_record(uint64_t index, const StateRecordBody& body, uint64_t hits,
                    uint64_t last_use_usec);
  // The same discipline for a reserved extent (its payload checksum not known yet).
  void write_reservation(uint64_t index, const StateRecordBody& body);
  void clear_record(uint64_t index);
  // The hints of a valid record (no check needed to stay safe).
  void write_upgrade(uint64_t index, uint8_t entry_class, uint8_t evidence, bool pinned);
  void write_use(uint64_t index, uint64_t hits, uint64_t last_use_usec);
  enum class RecordCheck { Empty, Valid, Reservation, Damaged };
  // Empty: never written or cleared; Reservation: a whole reservation record;
  // Damaged: its valid word is set (or garbage) but its checksum fails. ret_record is
  // filled when Valid or Reservation.
  RecordCheck check_record(uint64_t index, StateRecord& ret_record) const;
  // The same check of a record copied out of records_to_adopt().
  static RecordCheck check(const StateRecord& record);
  // Every record below the high-water mark, for adoption to read once (nothing writes
  // them until it is done), through a read-only view of the segment whose pages are
  // mapped first with one read populate: faulting a large segment in page by page costs
  // several times more, and on some VMs the first read of each 4 KiB page through a
  // writable mapping costs three to four times what it costs through a read-only one
  // (docs/operations.md). Without the view, through the segment's own mapping.
  RecordsToAdopt records_to_adopt() const;
  // The class, evidence and pin of a valid record: the upgrade word when its check
  // holds, else what the body says. Returns whether the upgrade word held.
  static bool upgraded(const StateRecord& record, uint8_t& ret_class, uint8_t& ret_evidence,
                       bool& ret_pinned);

  // Namespaces, by index.
  void write_namespace(uint32_t index, const NamespaceRecord& record);
  void clear_namespace(uint32_t index);
  bool namespace_valid(uint32_t index, NamespaceRecord& ret_record) const;

  // Connected engines, by slot: one 8-byte word each (pid << 32 | tag).
  void set_connection(uint32_t slot, uint32_t pid);
  void clear_connection(uint32_t slot);
  uint32_t connection_pid(uint32_t slot) const;  // 0: none
  uint32_t connection_capacity() const { return header_.connection_capacity; }

  // Adoption saw a record of this write number: later writes number past it.
  void note_sequence(uint64_t seen) { sequence_ = seen > sequence_ ? seen : sequence_; }

  // The raw mapping, for tests that scribble on it.
  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  // On reserved huge pages (vm.nr_hugepages), not 4 KiB ones.
  bool on_huge_pages() const { return on_huge_pages_; }
  // Else on shmem, mapped to take transparent huge pages, and its first page is a
  // huge one (shmem_pmd_mapped_bytes()): the kernel gives them, through shmem_enabled
  // or the tmpfs mount's huge= option. Pages are allocated as records are written.
  bool on_transparent_pages() const { return on_transparent_pages_; }
  uint64_t records_offset() const { return records_offset_; }

 private:
  StateSegment() = default;
  // `transparent`: a shmem segment is mapped 2 MiB-aligned and advised MADV_HUGEPAGE.
  Status map(int fd, uint64_t bytes, bool transparent, int& ret_errno);
  void write(uint64_t index, const StateRecordBody& body, uint64_t hits, uint64_t last_use_usec,
             uint64_t valid_word);
  void place();  // region offsets from header_
  StateRecord* records() const { return reinterpret_cast<StateRecord*>(base_ + records_offset_); }
  NamespaceRecord* namespaces() const {
    return reinterpret_cast<NamespaceRecord*>(base_ + namespaces_offset_);
  }
  uint64_t* connections() const { return reinterpret_cast<uint64_t*>(base_ + connections_offset_); }
  StateHints* hints() const { return reinterpret_cast<StateHints*>(base_ + state_header_bytes); }

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  StateHeader header_{};  // a private copy: checked once, never read from the segment again
  uint64_t namespaces_offset_ = 0;
  uint64_t connections_offset_ = 0;
  uint64_t records_offset_ = 0;
  uint64_t sequence_ = 0;
  bool on_huge_pages_ = false;
  bool on_transparent_pages_ = false;
};

// Bytes of a segment for this many records.
uint64_t state_segment_bytes(uint64_t record_capacity);
// On reserved huge pages a segment's size is rounded up to whole pages of this size.
inline constexpr uint64_t state_huge_page_bytes = 2ull << 20;
uint64_t state_huge_segment_bytes(uint64_t bytes);

}  // namespace kvpark::shm
