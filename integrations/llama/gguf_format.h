// The GGUF container's constants, shared by the test-model writer (gguf_writer.cpp)
// and the metadata reader (gguf_memory.cpp). Little-endian throughout.
#pragma once

#include <cstdint>

namespace kvpark::llama {

inline constexpr uint32_t gguf_magic = 0x46554747;  // "GGUF"

// Value types of metadata key/values (gguf.h's gguf_type).
enum GgufType : uint32_t {
  type_u8,
  type_i8,
  type_u16,
  type_i16,
  type_u32,
  type_i32,
  type_f32,
  type_bool,
  type_string,
  type_array,
  type_u64,
  type_i64,
  type_f64,
  type_count
};

}  // namespace kvpark::llama
