// The snapshot payload kvpark_llama parks: a header, then llama.cpp's sequence
// state bytes. Lives in kvparkd's arena and on its disk tier, so it is versioned
// and checked on both ends (STYLE.md §4, §8).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvpark::llama {

struct SnapshotHeader {
  static constexpr uint64_t magic_value = 0x31564c4b5241504bull;  // "KPARKLV1"
  static constexpr uint32_t format_version = 1;                   // bump when the layout changes

  uint64_t magic;
  uint32_t version;
  uint32_t position_tokens;  // the state is after tokens [0, position_tokens)
  uint64_t state_bytes;      // llama.cpp state bytes that follow the header
  uint64_t state_xxh3_64;    // XXH3-64 of those bytes
};
static_assert(sizeof(SnapshotHeader) == 32 && std::is_trivially_copyable_v<SnapshotHeader>);

enum class SnapshotCheck {
  ok,
  short_payload,
  bad_magic,
  bad_version,
  wrong_position,
  wrong_size,
  bad_checksum
};

// Writes the header for state_bytes bytes already at payload + sizeof(SnapshotHeader).
void snapshot_seal_header(void* payload, uint32_t position_tokens, uint64_t state_bytes);

// Checks payload[0, payload_bytes) as a snapshot at position_tokens: header fields
// first, then the checksum over the state bytes.
SnapshotCheck snapshot_check(const void* payload, uint64_t payload_bytes, uint32_t position_tokens);

}  // namespace kvpark::llama
