// The on-disk record: one file per parked entry (docs/disk.md).
//
//   [0, 4096)                          RecordHeader, zero-padded
//   [4096, image_offset)               u64 XXH3-64 per checksum chunk of the image, zero-padded
//   [image_offset, +align(image, 4K))  the image: the arena extent [EntryHeader | tokens | payload]
//
// A file's name is its RecordId (a hash of the entry key), so a record for a key that is
// already on disk replaces the old one by rename. Every field a reader trusts is covered by
// header_checksum (the header) or table_checksum (the chunk table); the image by the table.
// Bump record_format_version whenever this layout changes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "iouring/disk_limits.h"
#include "proto/types.h"

namespace kvpark::disk {

inline constexpr uint32_t record_magic = 0x5250564b;  // "KVPR"
inline constexpr uint16_t record_format_version = 2;   // 2: parent_hash, payload_checksum; bump when the layout changes
inline constexpr uint64_t record_header_page_bytes = io_align_bytes;

struct RecordHeader {
  uint32_t magic;               // record_magic
  uint16_t format_version;      // record_format_version
  uint16_t header_bytes;        // sizeof(RecordHeader)
  uint8_t kind;                 // EntryKind
  uint8_t entry_class;          // EntryClass
  uint8_t evidence;             // Evidence
  uint8_t snapshot_required;    // namespace geometry, 0 or 1
  uint32_t block_tokens;        // namespace geometry
  NamespaceId namespace_id;
  uint64_t block_payload_bytes; // namespace geometry
  uint32_t chain_tokens;        // hash granularity of the namespace's chain
  uint32_t token_count;         // block: block_tokens; snapshot: tail tokens
  Hash128 key_hash;             // block: chain hash; snapshot: anchor hash
  Hash128 tail_digest;          // snapshot: XXH3-128 of the tail token ids; block: zero
  uint32_t position;            // tokens covered once restored
  uint32_t anchor_chunks;       // snapshot: whole chunks before the tail; block: chain index
  uint64_t payload_bytes;       // payload inside the image
  uint64_t image_bytes;         // the whole extent image stored in this record
  uint64_t creator_session;
  uint64_t payload_checksum;    // XXH3-64 of the payload as sealed (engines verify restores)
  uint64_t hits;
  uint64_t created_unix_usec;
  Hash128 parent_hash;          // block: h[anchor_chunks-1], the namespace id at 0; snapshot: zero
  uint32_t checksum_chunk_bytes;  // image bytes per table entry (power of two)
  uint32_t chunk_count;           // table entries: ceil(image_bytes / checksum_chunk_bytes)
  uint64_t table_checksum;        // XXH3-64 of the chunk_count table entries
  uint64_t header_checksum;       // XXH3-64 of this struct with this field zeroed
};
static_assert(std::is_trivially_copyable_v<RecordHeader>);
static_assert(std::is_standard_layout_v<RecordHeader>);
static_assert(sizeof(RecordHeader) == 176);
static_assert(sizeof(RecordHeader) <= record_header_page_bytes);

// Identity of a record on disk: XXH3-128 of (namespace, kind, key_hash, tail_digest).
struct RecordId {
  Hash128 value;
  auto operator<=>(const RecordId&) const = default;
};
struct RecordIdHasher {
  size_t operator()(const RecordId& id) const noexcept { return Hash128Hasher{}(id.value); }
};

RecordId record_id_for(const RecordHeader& header);
std::string record_id_hex(const RecordId& id);               // 32 lowercase hex digits
bool parse_record_id_hex(std::string_view hex, RecordId& ret);
inline uint32_t record_fanout_dir(const RecordId& id) { return static_cast<uint32_t>(id.value.high >> 56); }

inline constexpr uint64_t align_io(uint64_t bytes) { return (bytes + io_align_bytes - 1) / io_align_bytes * io_align_bytes; }

// Byte offsets of a record's regions, from its header.
struct RecordLayout {
  uint64_t table_offset;  // == record_header_page_bytes
  uint64_t table_bytes;   // padded
  uint64_t image_offset;
  uint64_t file_bytes;    // whole file, padded
};
RecordLayout record_layout(uint64_t image_bytes, uint32_t checksum_chunk_bytes);
uint32_t record_chunk_count(uint64_t image_bytes, uint32_t checksum_chunk_bytes);

uint64_t record_header_checksum(const RecordHeader& header);
uint64_t record_table_checksum(const uint64_t* table, uint32_t chunk_count);
uint64_t record_chunk_checksum(const uint8_t* bytes, uint64_t count);

// Fills the store-owned fields of a caller's metadata (magic, version, sizes, chunking).
// Checksums stay zero until the table is complete; seal_record_header() sets them.
RecordHeader prepare_record_header(const RecordHeader& meta, uint32_t checksum_chunk_bytes);
void seal_record_header(RecordHeader& header, const uint64_t* table);

// Why a header read from disk is not usable; None when it verifies.
enum class HeaderDefect : uint8_t {
  None = 0,
  BadMagic,          // not a record (zeroed, garbage)
  OtherVersion,      // a record of another format version: left alone
  BadChecksum,
  BadFields,         // checksum fine but fields inconsistent (a writer bug)
  SizeMismatch,      // file size differs from the layout the header describes (truncated)
};
std::string_view header_defect_name(HeaderDefect defect);

// Checks a header read back from a file of `file_bytes` bytes (pair of check_record_for_write).
HeaderDefect check_record_header(const RecordHeader& header, uint64_t file_bytes);
// Asserts what spill() requires of caller metadata and of a sealed header (a bug otherwise).
bool record_meta_valid(const RecordHeader& meta);
void check_record_for_write(const RecordHeader& sealed, const uint64_t* table);

}  // namespace kvpark::disk
