#include "integrations/llama/snapshot_format.h"

#include <xxhash.h>

#include <cassert>
#include <cstring>

namespace kvpark::llama {

void snapshot_seal_header(void* payload, uint32_t position_tokens, uint64_t state_bytes) {
  assert(payload != nullptr && position_tokens > 0);
  const auto* state = static_cast<const uint8_t*>(payload) + sizeof(SnapshotHeader);
  const SnapshotHeader header{.magic = SnapshotHeader::magic_value,
                              .version = SnapshotHeader::format_version,
                              .position_tokens = position_tokens,
                              .state_bytes = state_bytes,
                              .state_xxh3_64 = XXH3_64bits(state, state_bytes)};
  std::memcpy(payload, &header, sizeof header);
}

SnapshotCheck snapshot_check(const void* payload, uint64_t payload_bytes,
                             uint32_t position_tokens) {
  if (payload == nullptr || payload_bytes < sizeof(SnapshotHeader))
    return SnapshotCheck::short_payload;
  SnapshotHeader header;
  std::memcpy(&header, payload, sizeof header);
  if (header.magic != SnapshotHeader::magic_value) return SnapshotCheck::bad_magic;
  if (header.version != SnapshotHeader::format_version) return SnapshotCheck::bad_version;
  if (header.position_tokens != position_tokens) return SnapshotCheck::wrong_position;
  if (header.state_bytes != payload_bytes - sizeof(SnapshotHeader))
    return SnapshotCheck::wrong_size;
  const auto* state = static_cast<const uint8_t*>(payload) + sizeof(SnapshotHeader);
  if (XXH3_64bits(state, header.state_bytes) != header.state_xxh3_64)
    return SnapshotCheck::bad_checksum;
  return SnapshotCheck::ok;
}

}  // namespace kvpark::llama
