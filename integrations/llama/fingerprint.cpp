// The namespace fingerprint (the weights digest is in weights_digest.cpp).
#include <xxhash.h>

#include <cstdlib>
#include <vector>

#include "integrations/llama/kvpark_llama.h"
#include "integrations/llama/weights_digest.h"

namespace kvpark::llama {
namespace {

constexpr uint32_t fingerprint_format_version = 2;  // bump when the fields below change

// Field-by-field serialization, so padding never reaches the hash.
class Fields {
 public:
  template <typename T>
  void add(T value) {
    static_assert(std::is_trivially_copyable_v<T> && !std::is_pointer_v<T>);
    const auto* b = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), b, b + sizeof value);
  }
  kvpark_hash128 hash() const {
    const XXH128_hash_t h = XXH3_128bits(bytes_.data(), bytes_.size());
    return kvpark_hash128{.low = h.low64, .high = h.high64};
  }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

const char* status_string(Status status) {
  switch (status) {
    case Status::ok:
      return "ok";
    case Status::not_found:
      return "not found";
    case Status::unavailable:
      return "unavailable";
    case Status::arena_full:
      return "arena full";
    case Status::corrupt:
      return "corrupt";
    case Status::engine_error:
      return "engine error";
    case Status::invalid_argument:
      return "invalid argument";
    case Status::io_error:
      return "I/O error";
  }
  return "unknown";
}

Status digest_weights(const std::string& model_path, const std::string& cache_dir,
                      kvpark_hash128* ret_digest) {
  switch (digest_model_file(model_path, cache_dir, ret_digest)) {
    case DigestStatus::ok:
      return Status::ok;
    case DigestStatus::not_found:
      return Status::not_found;
    case DigestStatus::io_error:
      return Status::io_error;
  }
  return Status::io_error;
}

bool attention_rotation_disabled() {
  // llama-kv-cache.cpp reads it the same way, once per cache.
  const char* value = std::getenv("LLAMA_ATTN_ROT_DISABLE");
  return value != nullptr && std::atoi(value) != 0;
}

kvpark_hash128 namespace_id(kvpark_hash128 weights_digest, const llama_context_params& p,
                            bool rotation_disabled) {
  Fields f;
  f.add(uint64_t(0x6b767061726b6c6cull));  // "kvparkll": this integration's namespaces
  f.add(fingerprint_format_version);
  f.add(weights_digest.low);
  f.add(weights_digest.high);
  f.add(uint32_t(LLAMA_STATE_SEQ_MAGIC));
  f.add(uint32_t(LLAMA_STATE_SEQ_VERSION));
  f.add(int32_t(p.type_k));
  f.add(int32_t(p.type_v));
  f.add(int32_t(p.flash_attn_type));  // V is stored transposed without flash attention
  f.add(p.n_seq_max);
  f.add(p.n_rs_seq);
  f.add(uint8_t(p.kv_unified));
  f.add(uint8_t(p.swa_full));
  f.add(int32_t(p.ctx_type));
  f.add(int32_t(p.rope_scaling_type));
  f.add(p.rope_freq_base);
  f.add(p.rope_freq_scale);
  f.add(p.yarn_ext_factor);
  f.add(p.yarn_attn_factor);
  f.add(p.yarn_beta_fast);
  f.add(p.yarn_beta_slow);
  f.add(p.yarn_orig_ctx);
  f.add(int32_t(p.pooling_type));
  f.add(int32_t(p.attention_type));
  // Quantized K/V rows are stored after a Hadamard rotation the image does not record.
  f.add(uint8_t(rotation_disabled));
  return f.hash();
}

}  // namespace kvpark::llama
