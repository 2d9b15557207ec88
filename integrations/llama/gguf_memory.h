// What a model's sequence memory keeps, read from its GGUF metadata alone (no
// llama.cpp): kvpark-proxy serves llama-server, which does not report it, and a
// memory that keeps less than every position cannot be trimmed back after a restore.
//   kv_cache        every position's K and V: any prefix of a restored state is usable
//   sliding_window  interleaved sliding-window attention (iSWA): sliding layers keep the
//                   window the last position sees, so a state serves that position only
//   recurrent       recurrent or hybrid (SSM, short convolution, RWKV; with or without
//                   attention layers): one state for one exact position
// Read the way the pinned llama.cpp decides: a positive `ARCH.attention.sliding_window`
// (gemma2 has one whether or not the key is written), `ARCH.ssm.*`,
// `ARCH.shortconv.*`, `ARCH.wkv.*` keys, or a per-layer `ARCH.attention.head_count_kv`
// holding a 0 (a layer without attention).
#pragma once

#include <string>

namespace kvpark::llama {

enum class MemoryShape { kv_cache, sliding_window, recurrent };
const char* memory_shape_string(MemoryShape shape);

enum class GgufReadStatus { ok, not_found, io_error, malformed };

// Reads the metadata of the GGUF file at `path` (not its tensors). *ret_shape is set
// only on ok.
GgufReadStatus read_memory_shape(const std::string& path, MemoryShape* ret_shape);

}  // namespace kvpark::llama
