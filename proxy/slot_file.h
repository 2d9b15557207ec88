// The snapshot payload kvpark-proxy parks: a header, then the bytes of a
// llama-server slot file (/slots/N?action=save) verbatim. It lives in kvparkd's
// arena and on its disk tier, so it is versioned and checked before any byte goes
// back to llama-server (STYLE.md §4, §8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvpark::proxy {

struct SlotFileHeader {
  static constexpr uint64_t magic_value = 0x3158504b5241504bull;  // "KPARKPX1"
  static constexpr uint32_t format_version = 1;                   // bump when the layout changes

  uint64_t magic;
  uint32_t version;
  uint32_t position_tokens;  // the key: the state covers at least tokens [0, position_tokens)
  uint64_t file_bytes;       // slot file bytes that follow the header
  uint64_t file_xxh3_64;     // XXH3-64 of those bytes
};
static_assert(sizeof(SlotFileHeader) == 32 && std::is_trivially_copyable_v<SlotFileHeader>);

enum class SlotFileCheck { ok, short_payload, bad_magic, bad_version, wrong_position, wrong_size,
                           bad_checksum };
const char* slot_file_check_string(SlotFileCheck check);

// Writes the header in front of file_bytes bytes already at payload + sizeof(header).
void slot_file_seal(void* payload, uint32_t position_tokens, uint64_t file_bytes);
SlotFileCheck slot_file_check(const void* payload, uint64_t payload_bytes,
                              uint32_t position_tokens);
// The header's checks alone (for a caller that hashes the bytes as it copies them).
SlotFileCheck slot_file_check_header(const void* payload, uint64_t payload_bytes,
                                     uint32_t position_tokens, SlotFileHeader* ret_header);

}  // namespace kvpark::proxy
