// Weights digest (with its cache) and the namespace fingerprint.
//
// Cache entries are one small file per model version under the cache dir, named by
// (device, inode, size, mtime in ns) and holding the 128-bit digest as 32 hex
// digits; written to a temporary file and renamed, so concurrent engines agree.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cassert>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "integrations/llama/kvpark_llama.h"

namespace kvpark::llama {
namespace {

constexpr size_t digest_read_bytes = 4u << 20;      // read chunk while hashing the model
constexpr uint32_t fingerprint_format_version = 1;  // bump when the fields below change

std::string cache_entry_path(const std::string& dir, const struct stat& st) {
  char name[160];
  std::snprintf(name, sizeof name, "/weights-%" PRIx64 "-%" PRIx64 "-%" PRIx64 "-%" PRId64 ".%09ld",
                uint64_t(st.st_dev), uint64_t(st.st_ino), uint64_t(st.st_size),
                int64_t(st.st_mtim.tv_sec), long(st.st_mtim.tv_nsec));
  return dir + name;
}

bool read_cache_entry(const std::string& path, kvpark_hash128* ret_digest) {
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  unsigned long long high = 0, low = 0;
  const bool parsed = std::fscanf(f, "%16llx%16llx", &high, &low) == 2;
  std::fclose(f);
  if (parsed) *ret_digest = kvpark_hash128{.low = low, .high = high};
  return parsed;
}

void write_cache_entry(const std::string& dir, const std::string& path, kvpark_hash128 digest) {
  // Best effort: a cache that cannot be written only costs a re-read next time.
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(temporary.c_str(), "we");
  if (f == nullptr) return;
  std::fprintf(f, "%016llx%016llx\n", (unsigned long long)digest.high,
               (unsigned long long)digest.low);
  if (std::fclose(f) != 0 || std::rename(temporary.c_str(), path.c_str()) != 0)
    std::remove(temporary.c_str());
}

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

std::string default_cache_dir() {
  if (const char* dir = std::getenv("KVPARK_LLAMA_CACHE"); dir != nullptr && dir[0] != '\0')
    return dir;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "/tmp") + "/.cache/kvpark/llama";
}

Status digest_weights(const std::string& model_path, const std::string& cache_dir,
                      kvpark_hash128* ret_digest) {
  const int fd = open(model_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? Status::not_found : Status::io_error;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return Status::io_error;
  }
  const std::string entry = cache_dir.empty() ? std::string() : cache_entry_path(cache_dir, st);
  if (!entry.empty() && read_cache_entry(entry, ret_digest)) {
    close(fd);
    return Status::ok;
  }
  XXH3_state_t* state = XXH3_createState();
  assert(state != nullptr);
  XXH3_128bits_reset(state);
  std::vector<uint8_t> chunk(digest_read_bytes);
  Status status = Status::ok;
  for (;;) {
    const ssize_t n = read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = Status::io_error;
    if (n <= 0) break;
    XXH3_128bits_update(state, chunk.data(), size_t(n));
  }
  close(fd);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  if (status != Status::ok) return status;
  const kvpark_hash128 digest{.low = h.low64, .high = h.high64};
  if (!entry.empty()) write_cache_entry(cache_dir, entry, digest);
  *ret_digest = digest;
  return Status::ok;
}

kvpark_hash128 namespace_id(kvpark_hash128 weights_digest, const llama_context_params& p) {
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
  return f.hash();
}

}  // namespace kvpark::llama
