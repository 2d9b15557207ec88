// Record header math, checksums and the checks at both ends of the disk boundary.
#include "iouring/record_format.h"

#include <cassert>
#include <cstring>

#include "proto/xxh3.h"

namespace kvpark::disk {

RecordId record_id_for(const RecordHeader& header) {
  struct Key {
    NamespaceId namespace_id;
    Hash128 key_hash;
    Hash128 tail_digest;
    uint64_t kind;
  } key{header.namespace_id, header.key_hash, header.tail_digest, header.kind};
  static_assert(sizeof(Key) == 56);
  XXH128_hash_t h = XXH3_128bits(&key, sizeof key);
  return RecordId{Hash128{h.low64, h.high64}};
}

std::string record_id_hex(const RecordId& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) out[i] = digits[(id.value.high >> (60 - 4 * i)) & 0xf];
  for (int i = 0; i < 16; ++i) out[16 + i] = digits[(id.value.low >> (60 - 4 * i)) & 0xf];
  return out;
}

bool parse_record_id_hex(std::string_view hex, RecordId& ret) {
  if (hex.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    uint64_t v;
    if (c >= '0' && c <= '9') v = c - '0';
    else if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    else return false;
    parts[i / 16] = parts[i / 16] << 4 | v;
  }
  ret = RecordId{Hash128{parts[1], parts[0]}};
  return true;
}

uint32_t record_chunk_count(uint64_t image_bytes, uint32_t checksum_chunk_bytes) {
  return static_cast<uint32_t>((image_bytes + checksum_chunk_bytes - 1) / checksum_chunk_bytes);
}

RecordLayout record_layout(uint64_t image_bytes, uint32_t checksum_chunk_bytes) {
  RecordLayout layout;
  layout.table_offset = record_header_page_bytes;
  layout.table_bytes = align_io(uint64_t{record_chunk_count(image_bytes, checksum_chunk_bytes)} * 8);
  layout.image_offset = layout.table_offset + layout.table_bytes;
  layout.file_bytes = layout.image_offset + align_io(image_bytes);
  return layout;
}

uint64_t record_header_checksum(const RecordHeader& header) {
  RecordHeader copy = header;
  copy.header_checksum = 0;
  return XXH3_64bits(&copy, sizeof copy);
}

uint64_t record_table_checksum(const uint64_t* table, uint32_t chunk_count) {
  return XXH3_64bits(table, uint64_t{chunk_count} * 8);
}

uint64_t record_chunk_checksum(const uint8_t* bytes, uint64_t count) { return XXH3_64bits(bytes, count); }

std::string_view header_defect_name(HeaderDefect defect) {
  switch (defect) {
    case HeaderDefect::None: return "none";
    case HeaderDefect::BadMagic: return "bad magic";
    case HeaderDefect::OtherVersion: return "other format version";
    case HeaderDefect::BadChecksum: return "header checksum mismatch";
    case HeaderDefect::BadFields: return "inconsistent header fields";
    case HeaderDefect::SizeMismatch: return "file size does not match header";
  }
  return "unknown";
}

bool record_meta_valid(const RecordHeader& meta) {
  if (meta.kind != static_cast<uint8_t>(EntryKind::Block) && meta.kind != static_cast<uint8_t>(EntryKind::Snapshot))
    return false;
  if (meta.entry_class > entry_class_max || meta.evidence > evidence_max || meta.snapshot_required > 1) return false;
  if (meta.image_bytes == 0 || meta.image_bytes > record_image_bytes_max) return false;
  if (meta.payload_bytes > meta.image_bytes) return false;
  if (meta.kind == static_cast<uint8_t>(EntryKind::Block) && meta.tail_digest != Hash128{}) return false;
  return true;
}

static bool chunking_valid(const RecordHeader& h) {
  uint32_t c = h.checksum_chunk_bytes;
  if (c < chunk_bytes_min || c > chunk_bytes_max || (c & (c - 1)) != 0) return false;
  return h.chunk_count == record_chunk_count(h.image_bytes, c);
}

RecordHeader prepare_record_header(const RecordHeader& meta, uint32_t checksum_chunk_bytes) {
  assert(record_meta_valid(meta));
  RecordHeader h = meta;
  h.magic = record_magic;
  h.format_version = record_format_version;
  h.header_bytes = sizeof(RecordHeader);
  h.checksum_chunk_bytes = checksum_chunk_bytes;
  h.chunk_count = record_chunk_count(meta.image_bytes, checksum_chunk_bytes);
  h.table_checksum = 0;
  h.header_checksum = 0;
  assert(chunking_valid(h));
  return h;
}

void seal_record_header(RecordHeader& header, const uint64_t* table) {
  header.table_checksum = record_table_checksum(table, header.chunk_count);
  header.header_checksum = record_header_checksum(header);
}

HeaderDefect check_record_header(const RecordHeader& h, uint64_t file_bytes) {
  if (h.magic != record_magic) return HeaderDefect::BadMagic;
  if (h.format_version != record_format_version) return HeaderDefect::OtherVersion;
  if (h.header_checksum != record_header_checksum(h)) return HeaderDefect::BadChecksum;
  if (h.header_bytes != sizeof(RecordHeader) || !record_meta_valid(h) || !chunking_valid(h))
    return HeaderDefect::BadFields;
  if (file_bytes != record_layout(h.image_bytes, h.checksum_chunk_bytes).file_bytes) return HeaderDefect::SizeMismatch;
  return HeaderDefect::None;
}

void check_record_for_write(const RecordHeader& sealed, const uint64_t* table) {
  // Pair assertion with check_record_header(): what we write must be what a reader accepts.
  [[maybe_unused]] uint64_t file_bytes = record_layout(sealed.image_bytes, sealed.checksum_chunk_bytes).file_bytes;
  assert(check_record_header(sealed, file_bytes) == HeaderDefect::None);
  assert(sealed.table_checksum == record_table_checksum(table, sealed.chunk_count));
  (void)table;
}

}  // namespace kvpark::disk
