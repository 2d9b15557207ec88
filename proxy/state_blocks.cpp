#include "proxy/state_blocks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>

#include "proxy/slot_file_writer.h"

namespace kvpark::proxy {
namespace {

bool equal(const std::vector<uint8_t>& a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

bool refuse(std::string* ret_why, std::string why) {
  *ret_why = std::move(why);
  return false;
}

SlotImageCheck refused(std::string* ret_why, SlotImageCheck check, std::string why) {
  *ret_why = std::move(why);
  return check;
}

}  // namespace

bool learn_block_shape(std::span<const uint8_t> one, std::span<const uint8_t> two,
                       kvpark_hash128 base, std::shared_ptr<const BlockShape>* ret_shape,
                       std::vector<uint8_t>* ret_prefix, std::string* ret_why) {
  llama::StateImage a, b;
  std::string reason;
  if (!llama::parse_state_image(one, llama::ImageKind::slot_file, &a, &reason) ||
      !llama::parse_state_image(two, llama::ImageKind::slot_file, &b, &reason))
    return refuse(ret_why, "slot files not split: " + reason);
  if (a.cells != 1 || b.cells != 2 || !(a.layout == b.layout) || a.tokens[0] != b.tokens[0])
    return refuse(ret_why, "slot files not split: the 1- and 2-token files do not agree");
  if (a.layout.token_kv_bytes() == 0)
    return refuse(ret_why, "slot files not split: no KV per token");
  if (!equal(llama::recompose(a, one, 1, state_block_tokens), one) ||
      !equal(llama::recompose(b, two, 2, 1), two))
    return refuse(ret_why, "slot files not split: one written again from its cells differs");
  std::vector<uint8_t> prefix = llama::recompose(b, two, 1, state_block_tokens);
  if (!equal(prefix, one))
    return refuse(ret_why,
                  "slot files not split: the 1-token file written from the 2-token one differs "
                  "from the upstream's own");
  *ret_shape = llama::make_block_shape(a.layout, base);
  *ret_prefix = std::move(prefix);
  return true;
}

bool write_slot_file_from_blocks(kvpark_plan* plan, const BlockShape& shape,
                                 std::span<const int32_t> tokens, uint32_t position,
                                 const std::string& path, std::string* ret_refused,
                                 bool* ret_corrupt) {
  assert(tokens.size() >= position && position > 0);
  *ret_corrupt = false;
  SlotFileWriter file;
  if (!file.open(path)) {
    *ret_refused = file.why();
    return false;
  }
  bool ok = llama::write_image_from_plan(plan, shape, tokens.first(position), position, nullptr,
                                         file, ret_refused, ret_corrupt);
  if (!file.finish(llama::state_image_bytes(shape.layout, position)) && ok) {
    *ret_refused = file.why();
    ok = false;
  }
  if (!ok) unlink(path.c_str());
  return ok;
}

SlotImageCheck read_slot_image(const std::string& path, const BlockShape& shape,
                               std::span<const int32_t> tokens, uint32_t position,
                               SlotImage* ret_image, std::string* ret_why) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    *ret_why = path + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return SlotImageCheck::unreadable;
  }
  SlotImage image;
  image.size = uint64_t(st.st_size);
  // No zeroing: every byte is read over. Out of memory fails this park, not the proxy.
  image.bytes.reset(new (std::nothrow) uint8_t[image.size]);
  if (image.bytes == nullptr) {
    close(fd);
    *ret_why = path + ": cannot hold its " + std::to_string(image.size) + " bytes in memory";
    return SlotImageCheck::unreadable;
  }
  bool ok = true;
  for (uint64_t at = 0; at < image.size;) {
    const ssize_t n = read(fd, image.bytes.get() + at, size_t(image.size - at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *ret_why = path + (n == 0 ? ": shrank while read" : ": " + std::string(std::strerror(errno)));
      ok = false;
      break;
    }
    at += uint64_t(n);
  }
  close(fd);
  if (!ok) return SlotImageCheck::unreadable;
  std::string reason;
  if (!llama::parse_state_image(std::span(image.bytes.get(), image.size),
                                llama::ImageKind::slot_file, &image.parsed, &reason))
    return refused(ret_why, SlotImageCheck::not_split, "slot file not split: " + reason);
  if (!(llama::placement_neutral(image.parsed.layout) == llama::placement_neutral(shape.layout)))
    return refused(ret_why, SlotImageCheck::other_layout,
                   "slot file not split: its layout is not the one checked at start");
  if (image.parsed.cells < position || tokens.size() < position ||
      !std::equal(tokens.begin(), tokens.begin() + position, image.parsed.tokens.begin()))
    return refused(ret_why, SlotImageCheck::other_tokens,
                   "the slot file does not hold the tokens it is parked for");
  *ret_image = std::move(image);
  return SlotImageCheck::ok;
}

}  // namespace kvpark::proxy
