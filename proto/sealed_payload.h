// A snapshot payload sealed by the engine side: a 32-byte header, then the body,
// an engine's own state bytes (llama.cpp sequence state for kvpark_llama, a
// llama-server slot file for kvpark-proxy). kvparkd stores it as opaque bytes in
// its arena and on its disk tier, so the layout is versioned and checked on both
// ends (STYLE.md §4, §8): sealed before kvpark_seal, checked before any byte goes
// back to the engine.
//
// The magic says who wrote the body and how to read it: each producer has its own
// (integrations/llama/snapshot_format.h, proxy/slot_file.h), so one never hands
// the other's bytes to its engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kvpark {

struct SealedPayloadHeader {
  static constexpr uint32_t format_version = 1;  // bump when the layout changes

  uint64_t magic;            // the producer's (see above)
  uint32_t version;          // format_version when sealed
  uint32_t position_tokens;  // the key: the state covers at least tokens [0, position_tokens)
  uint64_t body_bytes;       // bytes that follow the header
  uint64_t body_xxh3_64;     // XXH3-64 of those bytes
};
static_assert(sizeof(SealedPayloadHeader) == 32 &&
              std::is_trivially_copyable_v<SealedPayloadHeader>);

enum class SealedPayloadCheck {
  ok,
  short_payload,   // shorter than the header
  bad_magic,       // not this producer's, or not a sealed payload at all
  bad_version,     // another layout
  wrong_position,  // sealed for another position than the one looked up
  wrong_size,      // the header's body_bytes do not fill the payload
  bad_checksum,    // the body changed after sealing
};
// A short reason for a log line ("checksum mismatch").
const char* sealed_payload_check_string(SealedPayloadCheck check);

// Writes the header in front of body_bytes bytes already at payload + sizeof(header).
void sealed_payload_seal(void* payload, uint64_t magic, uint32_t position_tokens,
                         uint64_t body_bytes);

// Checks payload[0, payload_bytes) as `magic`'s payload at position_tokens: the
// header fields first, then the checksum over the body.
SealedPayloadCheck sealed_payload_check(const void* payload, uint64_t payload_bytes,
                                        uint64_t magic, uint32_t position_tokens);
// The header's checks alone, for a caller that hashes the body as it copies it;
// the header read goes to ret_header.
SealedPayloadCheck sealed_payload_check_header(const void* payload, uint64_t payload_bytes,
                                               uint64_t magic, uint32_t position_tokens,
                                               SealedPayloadHeader* ret_header);

}  // namespace kvpark
