#include "proxy/slot_file.h"

#include <cstring>

#include "proto/xxh3.h"

namespace kvpark::proxy {

const char* slot_file_check_string(SlotFileCheck check) {
  switch (check) {
    case SlotFileCheck::ok: return "ok";
    case SlotFileCheck::short_payload: return "payload shorter than its header";
    case SlotFileCheck::bad_magic: return "bad magic";
    case SlotFileCheck::bad_version: return "unknown format version";
    case SlotFileCheck::wrong_position: return "header names another position";
    case SlotFileCheck::wrong_size: return "size does not match the header";
    case SlotFileCheck::bad_checksum: return "checksum mismatch";
  }
  return "unknown";
}

void slot_file_seal(void* payload, uint32_t position_tokens, uint64_t file_bytes) {
  const auto* file = static_cast<const uint8_t*>(payload) + sizeof(SlotFileHeader);
  const SlotFileHeader header{.magic = SlotFileHeader::magic_value,
                              .version = SlotFileHeader::format_version,
                              .position_tokens = position_tokens,
                              .file_bytes = file_bytes,
                              .file_xxh3_64 = XXH3_64bits(file, file_bytes)};
  std::memcpy(payload, &header, sizeof header);
}

SlotFileCheck slot_file_check_header(const void* payload, uint64_t payload_bytes,
                                     uint32_t position_tokens, SlotFileHeader* ret_header) {
  if (payload_bytes < sizeof(SlotFileHeader)) return SlotFileCheck::short_payload;
  SlotFileHeader& h = *ret_header;
  std::memcpy(&h, payload, sizeof h);
  if (h.magic != SlotFileHeader::magic_value) return SlotFileCheck::bad_magic;
  if (h.version != SlotFileHeader::format_version) return SlotFileCheck::bad_version;
  if (h.position_tokens != position_tokens) return SlotFileCheck::wrong_position;
  if (h.file_bytes != payload_bytes - sizeof h) return SlotFileCheck::wrong_size;
  return SlotFileCheck::ok;
}

SlotFileCheck slot_file_check(const void* payload, uint64_t payload_bytes,
                              uint32_t position_tokens) {
  SlotFileHeader h;
  if (SlotFileCheck c = slot_file_check_header(payload, payload_bytes, position_tokens, &h);
      c != SlotFileCheck::ok)
    return c;
  const auto* file = static_cast<const uint8_t*>(payload) + sizeof h;
  if (XXH3_64bits(file, h.file_bytes) != h.file_xxh3_64) return SlotFileCheck::bad_checksum;
  return SlotFileCheck::ok;
}

}  // namespace kvpark::proxy
