// GGUF v3 layout: header (magic, version, tensor count, kv count), metadata
// key/values, tensor infos (name, dims, type, offset into the data section), padding
// to general.alignment, then tensor data, each tensor aligned. All little-endian.
#include "integrations/llama/gguf_writer.h"

#include <unistd.h>

#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "integrations/llama/gguf_format.h"

namespace kvpark::llama {
namespace {

constexpr uint32_t gguf_version = 3;
constexpr uint64_t gguf_alignment_bytes = 32;
constexpr uint32_t ggml_type_f32 = 0;

// llama.cpp token types (llama_token_type).
constexpr int32_t token_normal = 1;
constexpr int32_t token_unknown = 2;
constexpr int32_t token_control = 3;
constexpr int32_t token_byte = 6;

#define SPM_SPACE "\xe2\x96\x81"  // U+2581, SentencePiece's word boundary
constexpr const char* word_pieces[] = {SPM_SPACE,
                                       SPM_SPACE "the",
                                       SPM_SPACE "a",
                                       SPM_SPACE "of",
                                       SPM_SPACE "and",
                                       SPM_SPACE "to",
                                       SPM_SPACE "in",
                                       SPM_SPACE "is",
                                       SPM_SPACE "park",
                                       SPM_SPACE "cache",
                                       SPM_SPACE "state",
                                       SPM_SPACE "token",
                                       "er",
                                       "in",
                                       "on",
                                       "an",
                                       "re",
                                       "at",
                                       "en",
                                       "ed",
                                       "e",
                                       "t",
                                       "a",
                                       "o",
                                       "i",
                                       "n",
                                       "s",
                                       "r",
                                       "h",
                                       "l",
                                       "d",
                                       "c",
                                       "u",
                                       "m",
                                       "p",
                                       "k"};
constexpr uint32_t control_tokens = 3;  // <unk> <s> </s>
constexpr uint32_t byte_tokens = 256;

class Buffer {
 public:
  void u32(uint32_t v) { raw(&v, sizeof v); }
  void i32(int32_t v) { raw(&v, sizeof v); }
  void u64(uint64_t v) { raw(&v, sizeof v); }
  void f32(float v) { raw(&v, sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  void pad(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  // Metadata key/values.
  void kv_u32(std::string_view key, uint32_t v) { str(key), u32(type_u32), u32(v), ++kvs_; }
  void kv_f32(std::string_view key, float v) { str(key), u32(type_f32), f32(v), ++kvs_; }
  void kv_str(std::string_view key, std::string_view v) {
    str(key), u32(type_string), str(v), ++kvs_;
  }
  void kv_array_header(std::string_view key, uint32_t element_type, uint64_t count) {
    str(key), u32(type_array), u32(element_type), u64(count), ++kvs_;
  }
  uint64_t kv_count() const { return kvs_; }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
  uint64_t kvs_ = 0;
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the contiguous one
  bool norm;                   // all ones (plus noise) instead of small random values
};

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// lfm2: convolution and attention layers alternate, convolution first.
bool lfm2_attention_layer(uint32_t block) {
  return block % 2 == 1;
}

// The arch's tensors, in the order its loader creates them (names: llama-arch.cpp).
std::vector<Tensor> arch_tensors(const TestModelOptions& o) {
  const uint64_t n_embd = o.embedding_length;
  const uint64_t head_dim = n_embd / o.head_count;
  const uint64_t n_embd_kv = head_dim * o.head_count_kv;
  const uint64_t n_ff = o.feed_forward_length;
  const uint64_t n_vocab = test_model_vocab_size();
  const TestModelArch arch = o.arch;

  std::vector<Tensor> t;
  t.push_back({"token_embd.weight", {n_embd, n_vocab}, false});
  t.push_back({arch == TestModelArch::lfm2 ? "token_embd_norm.weight" : "output_norm.weight",
               {n_embd},
               true});
  t.push_back({"output.weight", {n_embd, n_vocab}, false});
  for (uint32_t b = 0; b < o.block_count; ++b) {
    const std::string p = "blk." + std::to_string(b) + ".";
    auto attention = [&] {
      t.push_back({p + "attn_q.weight", {n_embd, n_embd}, false});
      t.push_back({p + "attn_k.weight", {n_embd, n_embd_kv}, false});
      t.push_back({p + "attn_v.weight", {n_embd, n_embd_kv}, false});
      t.push_back({p + "attn_output.weight", {n_embd, n_embd}, false});
    };
    auto qk_norms = [&] {
      t.push_back({p + "attn_q_norm.weight", {head_dim}, true});
      t.push_back({p + "attn_k_norm.weight", {head_dim}, true});
    };
    auto dense_ffn = [&] {
      t.push_back({p + "ffn_gate.weight", {n_embd, n_ff}, false});
      t.push_back({p + "ffn_up.weight", {n_embd, n_ff}, false});
      t.push_back({p + "ffn_down.weight", {n_ff, n_embd}, false});
    };
    t.push_back({p + "attn_norm.weight", {n_embd}, true});
    switch (arch) {
      case TestModelArch::llama:
        attention();
        t.push_back({p + "ffn_norm.weight", {n_embd}, true});
        dense_ffn();
        break;
      case TestModelArch::qwen3moe:
        attention();
        qk_norms();
        t.push_back({p + "ffn_norm.weight", {n_embd}, true});
        t.push_back({p + "ffn_gate_inp.weight", {n_embd, o.expert_count}, false});
        t.push_back({p + "ffn_gate_exps.weight", {n_embd, n_ff, o.expert_count}, false});
        t.push_back({p + "ffn_up_exps.weight", {n_embd, n_ff, o.expert_count}, false});
        t.push_back({p + "ffn_down_exps.weight", {n_ff, n_embd, o.expert_count}, false});
        break;
      case TestModelArch::gemma3:
        attention();
        qk_norms();
        t.push_back({p + "post_attention_norm.weight", {n_embd}, true});
        t.push_back({p + "ffn_norm.weight", {n_embd}, true});
        dense_ffn();
        t.push_back({p + "post_ffw_norm.weight", {n_embd}, true});
        break;
      case TestModelArch::lfm2:
        if (lfm2_attention_layer(b)) {
          attention();
          qk_norms();
        } else {
          t.push_back({p + "shortconv.conv.weight", {o.shortconv_cache, n_embd}, false});
          t.push_back({p + "shortconv.in_proj.weight", {n_embd, 3 * n_embd}, false});
          t.push_back({p + "shortconv.out_proj.weight", {n_embd, n_embd}, false});
        }
        t.push_back({p + "ffn_norm.weight", {n_embd}, true});
        dense_ffn();
        break;
    }
  }
  return t;
}

// The arch's hyperparameters under its own prefix ("gemma3.context_length", ...).
void add_arch_metadata(const TestModelOptions& o, Buffer& out) {
  const std::string a = test_model_arch_name(o.arch);
  out.kv_u32(a + ".context_length", o.context_length);
  out.kv_u32(a + ".embedding_length", o.embedding_length);
  out.kv_u32(a + ".block_count", o.block_count);
  out.kv_u32(a + ".feed_forward_length", o.feed_forward_length);
  out.kv_u32(a + ".attention.head_count", o.head_count);
  if (o.arch == TestModelArch::lfm2) {  // per layer: 0 marks a convolution layer
    out.kv_array_header(a + ".attention.head_count_kv", type_u32, o.block_count);
    for (uint32_t b = 0; b < o.block_count; ++b)
      out.u32(lfm2_attention_layer(b) ? o.head_count_kv : 0);
    out.kv_u32(a + ".shortconv.l_cache", o.shortconv_cache);
  } else {
    out.kv_u32(a + ".attention.head_count_kv", o.head_count_kv);
  }
  out.kv_u32(a + ".rope.dimension_count", o.embedding_length / o.head_count);
  out.kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  if (o.arch == TestModelArch::qwen3moe) {
    out.kv_u32(a + ".expert_count", o.expert_count);
    out.kv_u32(a + ".expert_used_count", o.expert_used_count);
    out.kv_u32(a + ".expert_feed_forward_length", o.feed_forward_length);
  }
  if (o.arch == TestModelArch::gemma3) {
    out.kv_u32(a + ".attention.sliding_window", o.sliding_window);
    out.kv_u32(a + ".attention.sliding_window_pattern", o.sliding_window_pattern);
  }
}

bool valid(const TestModelOptions& o) {
  const bool attention = o.embedding_length > 0 && o.head_count > 0 && o.head_count_kv > 0 &&
                         o.embedding_length % o.head_count == 0 &&
                         o.head_count % o.head_count_kv == 0;
  const bool family =
      (o.arch != TestModelArch::qwen3moe ||
       (o.expert_used_count > 0 && o.expert_used_count <= o.expert_count)) &&
      (o.arch != TestModelArch::gemma3 || (o.sliding_window > 0 && o.sliding_window_pattern > 0)) &&
      (o.arch != TestModelArch::lfm2 || (o.shortconv_cache > 1 && o.block_count >= 2));
  return attention && family && o.block_count > 0 && o.feed_forward_length > 0 &&
         o.context_length > 0;
}

}  // namespace

const char* test_model_arch_name(TestModelArch arch) {
  switch (arch) {
    case TestModelArch::llama:
      return "llama";
    case TestModelArch::qwen3moe:
      return "qwen3moe";
    case TestModelArch::gemma3:
      return "gemma3";
    case TestModelArch::lfm2:
      return "lfm2";
  }
  return "?";
}

bool parse_test_model_arch(std::string_view name, TestModelArch* ret_arch) {
  for (TestModelArch arch : test_model_arches) {
    if (name == test_model_arch_name(arch)) {
      *ret_arch = arch;
      return true;
    }
  }
  return false;
}

uint32_t test_model_vocab_size() {
  return control_tokens + byte_tokens + uint32_t(std::size(word_pieces));
}

GgufStatus write_test_model(const std::string& path, const TestModelOptions& o) {
  if (!valid(o)) return GgufStatus::invalid_argument;
  const uint64_t n_vocab = test_model_vocab_size();
  const std::vector<Tensor> tensors = arch_tensors(o);

  Buffer metadata;
  Buffer& out = metadata;  // key/values first: the header needs their count
  out.kv_str("general.architecture", test_model_arch_name(o.arch));
  out.kv_str("general.name", std::string("kvpark test model ") + test_model_arch_name(o.arch) +
                                 " seed " + std::to_string(o.seed));
  out.kv_u32("general.alignment", gguf_alignment_bytes);
  add_arch_metadata(o, out);
  out.kv_str("tokenizer.ggml.model", "llama");
  out.kv_array_header("tokenizer.ggml.tokens", type_string, n_vocab);
  out.str("<unk>"), out.str("<s>"), out.str("</s>");
  for (uint32_t b = 0; b < byte_tokens; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    out.str(name);
  }
  for (const char* piece : word_pieces) out.str(piece);
  out.kv_array_header("tokenizer.ggml.scores", type_f32, n_vocab);
  for (uint64_t t = 0; t < n_vocab; ++t)
    out.f32(t < control_tokens + byte_tokens ? 0.0f : -float(t - control_tokens - byte_tokens));
  out.kv_array_header("tokenizer.ggml.token_type", type_i32, n_vocab);
  out.i32(token_unknown), out.i32(token_control), out.i32(token_control);
  for (uint32_t b = 0; b < byte_tokens; ++b)
    out.i32(o.text_only_output && b >= 0x80 ? token_normal : token_byte);
  for (size_t w = 0; w < std::size(word_pieces); ++w) out.i32(token_normal);
  out.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  out.kv_u32("tokenizer.ggml.bos_token_id", 1);
  out.kv_u32("tokenizer.ggml.eos_token_id", 2);

  Buffer file;
  file.u32(gguf_magic);
  file.u32(gguf_version);
  file.u64(tensors.size());
  file.u64(metadata.kv_count());
  file.raw(metadata.bytes().data(), metadata.size());

  uint64_t offset = 0;  // bytes from the start of the data section
  for (const Tensor& t : tensors) {
    file.str(t.name);
    file.u32(uint32_t(t.dims.size()));
    uint64_t elements = 1;
    for (uint64_t d : t.dims) file.u64(d), elements *= d;
    file.u32(ggml_type_f32);
    file.u64(offset);
    offset += elements * sizeof(float);
    offset = (offset + gguf_alignment_bytes - 1) / gguf_alignment_bytes * gguf_alignment_bytes;
  }
  file.pad(gguf_alignment_bytes);

  const size_t data_start = file.size();
  uint64_t rng = o.seed * 0x2545f4914f6cdd1dull + 1;
  for (const Tensor& t : tensors) {
    uint64_t elements = 1;
    for (uint64_t d : t.dims) elements *= d;
    // Uniform in [-a, a] with a = sqrt(3 / fan_in): unit-variance activations.
    const float amplitude = std::sqrt(3.0f / float(t.dims[0]));
    for (uint64_t i = 0; i < elements; ++i) {
      const float u = float(splitmix64(&rng) >> 40) / float(1 << 24) * 2.0f - 1.0f;
      file.f32(t.norm ? 1.0f + 0.1f * u : amplitude * u);
    }
    file.pad(gguf_alignment_bytes);
  }
  assert(file.size() - data_start == offset);

  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(temporary.c_str(), "wb");
  if (f == nullptr) return GgufStatus::io_error;
  const bool written = std::fwrite(file.bytes().data(), 1, file.size(), f) == file.size();
  if (std::fclose(f) != 0 || !written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
    return GgufStatus::io_error;
  }
  return GgufStatus::ok;
}

}  // namespace kvpark::llama
