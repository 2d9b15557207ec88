#include "proxy/state_blocks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <new>

#include "proto/sealed_payload.h"
#include "proto/xxh3.h"

namespace kvpark::proxy {
namespace {

// Staging between arena and file: small enough to stay in the L2 cache the verified
// copy just filled, large enough that writes stay few.
constexpr size_t staging_bytes = 256u << 10;

// The layout with what differs between the slots of one upstream cleared: the stream
// and sequence a slot's cells sit in. A slot file restores into any slot (llama-server
// loads it into the slot it names), so blocks parked from one serve every slot.
llama::StateLayout slot_neutral(llama::StateLayout layout) {
  layout.stream_index = 0;
  layout.cell_seq_id = 0;
  layout.source_seq_id = 0;
  return layout;
}

bool refuse(std::string* ret_why, std::string why) {
  *ret_why = std::move(why);
  return false;
}

SlotImageCheck refused(std::string* ret_why, SlotImageCheck check, std::string why) {
  *ret_why = std::move(why);
  return check;
}

// The image of cells [0, cells) written from `parsed`'s own cells, in blocks.
std::vector<uint8_t> rewrite(const llama::StateImage& parsed, std::span<const uint8_t> image,
                             uint32_t cells, uint32_t block_tokens) {
  std::vector<std::vector<uint8_t>> blocks;
  for (uint32_t first = 0; first < cells; first += block_tokens) {
    const uint32_t n = std::min(block_tokens, cells - first);
    blocks.emplace_back(n * parsed.layout.token_kv_bytes());
    llama::gather_cells(parsed, image.data(), first, n, blocks.back().data());
  }
  std::vector<uint8_t> out;
  llama::write_state_image(
      parsed.layout, std::span(parsed.tokens.data(), cells), cells, block_tokens,
      [&](uint32_t r) { return blocks[r].data(); },
      [&](std::span<const iovec> pieces) {
        for (const iovec& piece : pieces) {
          const auto* p = static_cast<const uint8_t*>(piece.iov_base);
          out.insert(out.end(), p, p + piece.iov_len);
        }
        return true;
      });
  return out;
}

bool equal(const std::vector<uint8_t>& a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// The slot file of a restore, written from the arena: the image's own bytes and each
// run's KV pass through one staging buffer on their way to the file. Runs below
// `blocks` are the plan's blocks, the last (if any) its tail snapshot's body.
class ArenaImage final : public llama::ImageParts {
 public:
  ArenaImage(kvpark_plan* plan, size_t blocks, int fd, std::string path)
      : plan_(plan), blocks_(blocks), fd_(fd), path_(std::move(path)), staging_(staging_bytes) {}

  bool own(const uint8_t* bytes, size_t count) override {
    while (count > 0) {
      const size_t take = std::min(count, staging_.size() - filled_);
      std::memcpy(staging_.data() + filled_, bytes, take);
      filled_ += take;
      bytes += take;
      count -= take;
      if (filled_ == staging_.size() && !flush()) return false;
    }
    return true;
  }

  bool run_part(uint32_t run, uint64_t offset, uint64_t bytes) override {
    while (bytes > 0) {
      const size_t take = size_t(std::min<uint64_t>(bytes, staging_.size() - filled_));
      uint8_t* at = staging_.data() + filled_;
      const kvpark_status s =
          run < blocks_
              ? kvpark_plan_read_block(plan_, run, offset, at, take)
              : kvpark_plan_read_snapshot(plan_, sizeof(SealedPayloadHeader) + offset, at, take);
      if (s != KVPARK_OK) {
        corrupt_ = s == KVPARK_CORRUPT;
        refused_ = corrupt_ ? sealed_payload_check_string(SealedPayloadCheck::bad_checksum)
                            : kvpark_status_string(s);
        return false;
      }
      filled_ += take;
      offset += take;
      bytes -= take;
      if (filled_ == staging_.size() && !flush()) return false;
    }
    return true;
  }

  bool flush() {
    for (size_t done = 0; done < filled_;) {
      const ssize_t n = write(fd_, staging_.data() + done, filled_ - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        refused_ = path_ + ": " + std::strerror(errno);
        return false;
      }
      done += size_t(n);
    }
    filled_ = 0;
    return true;
  }

  const std::string& refused() const { return refused_; }
  bool corrupt() const { return corrupt_; }

 private:
  kvpark_plan* const plan_;
  const size_t blocks_;
  const int fd_;
  const std::string path_;
  std::vector<uint8_t> staging_;
  size_t filled_ = 0;
  std::string refused_;
  bool corrupt_ = false;
};

}  // namespace

uint64_t BlockShape::tail_payload_bytes(uint32_t tail_cells) const {
  return sizeof(SealedPayloadHeader) + uint64_t(tail_cells) * layout.token_kv_bytes();
}

kvpark_hash128 block_namespace(kvpark_hash128 base, const llama::StateLayout& layout,
                               uint32_t block_tokens) {
  const llama::StateLayout l = slot_neutral(layout);
  std::string fields = "kvparkbk";
  auto add = [&](const auto& v) { fields.append(reinterpret_cast<const char*>(&v), sizeof v); };
  add(base.low);
  add(base.high);
  add(block_tokens);
  add(uint8_t(l.kind));
  add(l.slot_version);
  add(uint8_t(l.packed_tokens));
  add(l.packed_version);
  add(l.stream_count);
  add(uint8_t(l.v_transposed));
  for (const llama::LayerLayout& layer : l.layers) {
    add(layer.k_type);
    add(layer.k_row_bytes);
    add(layer.v_type);
    add(layer.v_row_bytes);
    add(layer.v_element_bytes);
    add(layer.v_width);
  }
  const XXH128_hash_t h = XXH3_128bits(fields.data(), fields.size());
  return kvpark_hash128{.low = h.low64, .high = h.high64};
}

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
  if (!equal(rewrite(a, one, 1, state_block_tokens), one) ||
      !equal(rewrite(b, two, 2, 1), two))
    return refuse(ret_why, "slot files not split: one written again from its cells differs");
  std::vector<uint8_t> prefix = rewrite(b, two, 1, state_block_tokens);
  if (!equal(prefix, one))
    return refuse(ret_why,
                  "slot files not split: the 1-token file written from the 2-token one differs "
                  "from the upstream's own");
  auto shape = std::make_shared<BlockShape>();
  shape->layout = a.layout;
  shape->block_bytes = uint64_t(shape->block_tokens) * a.layout.token_kv_bytes();
  shape->space = block_namespace(base, a.layout, shape->block_tokens);
  *ret_shape = std::move(shape);
  *ret_prefix = std::move(prefix);
  return true;
}

bool write_slot_file_from_blocks(kvpark_plan* plan, const BlockShape& shape,
                                 std::span<const int32_t> tokens, uint32_t position,
                                 const std::string& path, std::string* ret_refused,
                                 bool* ret_corrupt) {
  *ret_corrupt = false;
  const size_t blocks = std::min<size_t>(kvpark_plan_block_count(plan), position / shape.block_tokens);
  const uint32_t tail = position - uint32_t(blocks) * shape.block_tokens;
  assert(tail < shape.block_tokens && tokens.size() >= position && position > 0);
  if (tail > 0) {
    // The tail snapshot's header first (offset 0 starts its verified read).
    uint32_t at = 0;
    const uint64_t payload = kvpark_plan_snapshot_bytes(plan, &at);
    SealedPayloadHeader header;
    SealedPayloadCheck check = SealedPayloadCheck::wrong_size;
    if (at == position && payload == shape.tail_payload_bytes(tail)) {
      const kvpark_status s = kvpark_plan_read_snapshot(plan, 0, &header, sizeof header);
      if (s != KVPARK_OK) {
        *ret_refused = kvpark_status_string(s);
        return false;
      }
      check = sealed_payload_check_header(&header, payload, slot_tail_magic, position, &header);
    }
    if (check != SealedPayloadCheck::ok) {
      *ret_refused = std::string("tail snapshot: ") + sealed_payload_check_string(check);
      *ret_corrupt = true;
      return false;
    }
  }
  // Overwritten in place, not truncated: the file's pages stay allocated from the
  // slot's last restore (write_checked_file in parking.cpp says why).
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) {
    *ret_refused = path + ": " + std::strerror(errno);
    return false;
  }
  ArenaImage image(plan, blocks, fd, path);
  bool ok = llama::write_state_image(shape.layout, tokens.first(position), position,
                                     shape.block_tokens, image) &&
            image.flush();
  if (!ok) {
    *ret_refused = image.refused();
    *ret_corrupt = image.corrupt();
  }
  if (ok && ftruncate(fd, off_t(llama::state_image_bytes(shape.layout, position))) != 0) {
    *ret_refused = path + ": " + std::strerror(errno);
    ok = false;
  }
  if (close(fd) != 0 && ok) {
    *ret_refused = path + ": " + std::strerror(errno);
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
  if (!(slot_neutral(image.parsed.layout) == slot_neutral(shape.layout)))
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
