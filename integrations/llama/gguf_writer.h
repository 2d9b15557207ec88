// Tiny GGUFs with seeded random F32 weights, one per model family: the test models
// kvpark's llama.cpp integration and kvpark-proxy are checked against. They load in
// llama.cpp like any GGUF (SPM vocabulary with byte tokens, v3 container, 32-byte
// alignment); their outputs are meaningless, but deterministic for a given seed.
//
// The families differ where parked state differs (docs/llama.md, "Model families"):
//   llama     plain attention: the state is K and V of every token
//   qwen3moe  mixture of experts over attention: state as llama's, experts routed per token
//   gemma3    interleaved sliding-window attention (iSWA): sliding layers keep a window only
//   lfm2      hybrid: short-convolution layers (recurrent state, one per sequence) + attention
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvpark::llama {

enum class TestModelArch { llama, qwen3moe, gemma3, lfm2 };
inline constexpr TestModelArch test_model_arches[] = {TestModelArch::llama, TestModelArch::qwen3moe,
                                                      TestModelArch::gemma3, TestModelArch::lfm2};

// The GGUF architecture name ("llama", "qwen3moe", ...).
const char* test_model_arch_name(TestModelArch arch);
// The arch named `name`; false (ret_arch untouched) for any other name.
bool parse_test_model_arch(std::string_view name, TestModelArch* ret_arch);

struct TestModelOptions {
  TestModelArch arch = TestModelArch::llama;
  uint64_t seed = 1;  // different seed: different weights, another namespace
  uint32_t embedding_length = 64;
  uint32_t block_count = 2;  // layers
  uint32_t feed_forward_length = 128;  // per expert for qwen3moe
  uint32_t head_count = 4;
  uint32_t head_count_kv = 2;       // < head_count: grouped-query attention
  uint32_t context_length = 32768;  // tokens
  uint32_t expert_count = 4;        // qwen3moe
  uint32_t expert_used_count = 2;   // qwen3moe: experts routed per token
  uint32_t sliding_window = 128;    // gemma3: tokens a sliding layer attends to
  uint32_t sliding_window_pattern = 2;  // gemma3: every Nth layer attends globally
  uint32_t shortconv_cache = 3;         // lfm2: conv kernel length (state: cache - 1 tokens)
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
