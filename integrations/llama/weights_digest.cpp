// Weights digest of a model file, with its cache.
//
// Cache entries are one small file per model version under the cache dir, named by
// (device, inode, size, mtime in ns) and holding the 128-bit digest as 32 hex
// digits; written to a temporary file and renamed, so concurrent engines agree.
#include "integrations/llama/weights_digest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cassert>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "proto/names.h"

namespace kvpark::llama {
namespace {

constexpr size_t hex128_digits = 32;  // a cache entry: the digest as hex128 prints it

constexpr size_t digest_read_bytes = 4u << 20;  // read chunk while hashing the model

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
  char text[hex128_digits + 1] = {};
  const size_t got = std::fread(text, 1, hex128_digits, f);
  std::fclose(f);
  Hash128 digest;
  if (got != hex128_digits || !parse_hex128(std::string_view(text, got), digest)) return false;
  *ret_digest = kvpark_hash128{.low = digest.low, .high = digest.high};
  return true;
}

void write_cache_entry(const std::string& dir, const std::string& path, kvpark_hash128 digest) {
  // Best effort: a cache that cannot be written only costs a re-read next time.
  for (size_t i = 1; i <= dir.size(); ++i)
    if (i == dir.size() || dir[i] == '/') mkdir(dir.substr(0, i).c_str(), 0755);
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(temporary.c_str(), "we");
  if (f == nullptr) return;
  std::fprintf(f, "%s\n", hex128(Hash128{.low = digest.low, .high = digest.high}).c_str());
  if (std::fclose(f) != 0 || std::rename(temporary.c_str(), path.c_str()) != 0)
    std::remove(temporary.c_str());
}

}  // namespace

std::string default_cache_dir() {
  if (const char* dir = std::getenv("KVPARK_LLAMA_CACHE"); dir != nullptr && dir[0] != '\0')
    return dir;
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "/tmp") + "/.cache/kvpark/llama";
}

DigestStatus digest_model_file(const std::string& model_path, const std::string& cache_dir,
                               kvpark_hash128* ret_digest) {
  const int fd = open(model_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? DigestStatus::not_found : DigestStatus::io_error;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return DigestStatus::io_error;
  }
  const std::string entry = cache_dir.empty() ? std::string() : cache_entry_path(cache_dir, st);
  if (!entry.empty() && read_cache_entry(entry, ret_digest)) {
    close(fd);
    return DigestStatus::ok;
  }
  XXH3_state_t* state = XXH3_createState();
  assert(state != nullptr);
  XXH3_128bits_reset(state);
  std::vector<uint8_t> chunk(digest_read_bytes);
  DigestStatus status = DigestStatus::ok;
  for (;;) {
    const ssize_t n = read(fd, chunk.data(), chunk.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) status = DigestStatus::io_error;
    if (n <= 0) break;
    XXH3_128bits_update(state, chunk.data(), size_t(n));
  }
  close(fd);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  if (status != DigestStatus::ok) return status;
  const kvpark_hash128 digest{.low = h.low64, .high = h.high64};
  if (!entry.empty()) write_cache_entry(cache_dir, entry, digest);
  *ret_digest = digest;
  return DigestStatus::ok;
}

}  // namespace kvpark::llama
