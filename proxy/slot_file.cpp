#include "proxy/slot_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

namespace kvpark::proxy {

const char* slot_file_check_string(SlotFileCheck check) {
  switch (check) {
    case SlotFileCheck::ok: return "ok";
    case SlotFileCheck::short_payload: return "payload shorter than its header";
    case SlotFileCheck::bad_magic: return "bad magic";
    case SlotFileCheck::bad_version: return "unknown format version";
    case SlotFileCheck::wrong_position: return "header names another position";
    case SlotFileCheck::wrong_size: return "size does not match the header";
    case SlotFileCheck::bad_checksum: return "checksum mismatch";
  }
  return "unknown";
}

void slot_file_seal(void* payload, uint32_t position_tokens, uint64_t file_bytes) {
  const auto* file = static_cast<const uint8_t*>(payload) + sizeof(SlotFileHeader);
  const SlotFileHeader header{.magic = SlotFileHeader::magic_value,
                              .version = SlotFileHeader::format_version,
                              .position_tokens = position_tokens,
                              .file_bytes = file_bytes,
                              .file_xxh3_64 = XXH3_64bits(file, file_bytes)};
  std::memcpy(payload, &header, sizeof header);
}

SlotFileCheck slot_file_check(const void* payload, uint64_t payload_bytes,
                              uint32_t position_tokens) {
  if (payload_bytes < sizeof(SlotFileHeader)) return SlotFileCheck::short_payload;
  SlotFileHeader h;
  std::memcpy(&h, payload, sizeof h);
  if (h.magic != SlotFileHeader::magic_value) return SlotFileCheck::bad_magic;
  if (h.version != SlotFileHeader::format_version) return SlotFileCheck::bad_version;
  if (h.position_tokens != position_tokens) return SlotFileCheck::wrong_position;
  if (h.file_bytes != payload_bytes - sizeof h) return SlotFileCheck::wrong_size;
  const auto* file = static_cast<const uint8_t*>(payload) + sizeof h;
  if (XXH3_64bits(file, h.file_bytes) != h.file_xxh3_64) return SlotFileCheck::bad_checksum;
  return SlotFileCheck::ok;
}

bool read_whole_file(const std::string& path, std::vector<uint8_t>* ret_bytes,
                     std::string* ret_error) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *ret_error = path + ": " + std::strerror(errno);
    return false;
  }
  struct stat st;
  bool ok = fstat(fd, &st) == 0;
  if (ok) ret_bytes->resize(size_t(st.st_size));
  for (size_t at = 0; ok && at < ret_bytes->size();) {
    const ssize_t n = read(fd, ret_bytes->data() + at, ret_bytes->size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      if (n == 0) errno = EIO;  // the file shrank under us
      break;
    }
    at += size_t(n);
  }
  if (!ok) *ret_error = path + ": " + std::strerror(errno);
  close(fd);
  return ok;
}

bool write_whole_file(const std::string& path, const void* bytes, size_t n,
                      std::string* ret_error) {
  // Readable by the upstream, which may run as another user in the same group.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) {
    *ret_error = path + ": " + std::strerror(errno);
    return false;
  }
  const auto* p = static_cast<const uint8_t*>(bytes);
  bool ok = true;
  for (size_t at = 0; at < n;) {
    const ssize_t w = write(fd, p + at, n - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      ok = false;
      break;
    }
    at += size_t(w);
  }
  if (!ok) *ret_error = path + ": " + std::strerror(errno);
  if (close(fd) != 0 && ok) {
    ok = false;
    *ret_error = path + ": " + std::strerror(errno);
  }
  if (!ok) unlink(path.c_str());
  return ok;
}

}  // namespace kvpark::proxy
