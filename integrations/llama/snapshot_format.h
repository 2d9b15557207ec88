// The snapshot payload kvpark_llama parks: a sealed payload (proto/sealed_payload.h)
// whose body is llama.cpp's sequence state bytes (llama_state_seq_get_data_ext),
// for tokens [0, position_tokens).
#pragma once

#include <cstdint>

#include "proto/sealed_payload.h"

namespace kvpark::llama {

inline constexpr uint64_t snapshot_magic = 0x31564c4b5241504bull;  // "KPARKLV1"

}  // namespace kvpark::llama
