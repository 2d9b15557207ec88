// A tiny llama-architecture GGUF with seeded random F32 weights: the test model
// kvpark's llama.cpp integration is checked against. It loads in llama.cpp like
// any GGUF (SPM vocabulary with byte tokens, v3 container, 32-byte alignment);
// its outputs are meaningless, but deterministic for a given seed.
#pragma once

#include <cstdint>
#include <string>

namespace kvpark::llama {

struct TestModelOptions {
  uint64_t seed = 1;  // different seed: different weights, another namespace
  uint32_t embedding_length = 64;
  uint32_t block_count = 2;  // layers
  uint32_t feed_forward_length = 128;
  uint32_t head_count = 4;
  uint32_t head_count_kv = 2;       // < head_count: grouped-query attention
  uint32_t context_length = 32768;  // tokens
  // Types the byte tokens 0x80-0xFF as normal tokens, so they print as their names
  // ("<0x80>") and generated text is ASCII, always valid UTF-8 (llama-server's chat
  // endpoint refuses anything else); random weights otherwise sample lone bytes of
  // multi-byte sequences.
  bool text_only_output = false;
};

enum class GgufStatus { ok, invalid_argument, io_error };

// Writes the model to `path` (replaced atomically: a temporary file, then rename).
GgufStatus write_test_model(const std::string& path, const TestModelOptions& options);

// Tokens in the test model's vocabulary (control, 256 bytes, word pieces).
uint32_t test_model_vocab_size();

}  // namespace kvpark::llama
