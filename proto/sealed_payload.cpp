// Sealing and checking engine-side snapshot payloads (see sealed_payload.h).
#include "proto/sealed_payload.h"

#include <cassert>
#include <cstring>

#include "proto/xxh3.h"

namespace kvpark {

const char* sealed_payload_check_string(SealedPayloadCheck check) {
  switch (check) {
    case SealedPayloadCheck::ok: return "ok";
    case SealedPayloadCheck::short_payload: return "payload shorter than its header";
    case SealedPayloadCheck::bad_magic: return "bad magic";
    case SealedPayloadCheck::bad_version: return "unknown format version";
    case SealedPayloadCheck::wrong_position: return "header names another position";
    case SealedPayloadCheck::wrong_size: return "size does not match the header";
    case SealedPayloadCheck::bad_checksum: return "checksum mismatch";
  }
  return "unknown";
}

void sealed_payload_seal(void* payload, uint64_t magic, uint32_t position_tokens,
                         uint64_t body_bytes) {
  assert(payload != nullptr && position_tokens > 0);
  const auto* body = static_cast<const uint8_t*>(payload) + sizeof(SealedPayloadHeader);
  const SealedPayloadHeader header{.magic = magic,
                                   .version = SealedPayloadHeader::format_version,
                                   .position_tokens = position_tokens,
                                   .body_bytes = body_bytes,
                                   .body_xxh3_64 = XXH3_64bits(body, body_bytes)};
  std::memcpy(payload, &header, sizeof header);
}

SealedPayloadCheck sealed_payload_check_header(const void* payload, uint64_t payload_bytes,
                                               uint64_t magic, uint32_t position_tokens,
                                               SealedPayloadHeader* ret_header) {
  if (payload == nullptr || payload_bytes < sizeof(SealedPayloadHeader))
    return SealedPayloadCheck::short_payload;
  SealedPayloadHeader h;
  std::memcpy(&h, payload, sizeof h);
  if (h.magic != magic) return SealedPayloadCheck::bad_magic;
  if (h.version != SealedPayloadHeader::format_version) return SealedPayloadCheck::bad_version;
  if (h.position_tokens != position_tokens) return SealedPayloadCheck::wrong_position;
  if (h.body_bytes != payload_bytes - sizeof h) return SealedPayloadCheck::wrong_size;
  *ret_header = h;
  return SealedPayloadCheck::ok;
}

SealedPayloadCheck sealed_payload_check(const void* payload, uint64_t payload_bytes,
                                        uint64_t magic, uint32_t position_tokens) {
  SealedPayloadHeader h;
  if (const SealedPayloadCheck c =
          sealed_payload_check_header(payload, payload_bytes, magic, position_tokens, &h);
      c != SealedPayloadCheck::ok)
    return c;
  const auto* body = static_cast<const uint8_t*>(payload) + sizeof h;
  if (XXH3_64bits(body, h.body_bytes) != h.body_xxh3_64) return SealedPayloadCheck::bad_checksum;
  return SealedPayloadCheck::ok;
}

}  // namespace kvpark
