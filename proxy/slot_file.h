// The snapshot payload kvpark-proxy parks: a sealed payload (proto/sealed_payload.h)
// whose body is a llama-server slot file (/slots/N?action=save) verbatim; the
// position is the key, the state covers at least tokens [0, position_tokens).
#pragma once

#include <cstdint>

#include "proto/sealed_payload.h"

namespace kvpark::proxy {

inline constexpr uint64_t slot_file_magic = 0x3158504b5241504bull;  // "KPARKPX1"

}  // namespace kvpark::proxy
