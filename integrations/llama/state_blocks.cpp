#include "integrations/llama/state_blocks.h"

#include <algorithm>
#include <cassert>
#include <cstring>

#include "proto/limits.h"
#include "proto/sealed_payload.h"
#include "proto/xxh3.h"

namespace kvpark::llama {
namespace {

bool refuse(std::string* ret_why, std::string why) {
  *ret_why = std::move(why);
  return false;
}

bool equal(const std::vector<uint8_t>& a, std::span<const uint8_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

// A restored image's parts: its own bytes, and each run's KV, runs below `blocks` from
// the plan's blocks, the last (if any) from its tail snapshot, straight into the
// output.
class PlanImage final : public ImageParts {
 public:
  PlanImage(kvpark_plan* plan, size_t blocks, const uint8_t* tail_body, ImageOutput& out)
      : plan_(plan), blocks_(blocks), tail_body_(tail_body), out_(out) {}

  bool own(const uint8_t* bytes, size_t count) override {
    while (count > 0) {
      size_t room = 0;
      uint8_t* at = out_.space(&room);
      const size_t take = std::min(count, room);
      if (take == 0) return output_failed();
      std::memcpy(at, bytes, take);
      if (!out_.filled(take)) return output_failed();
      bytes += take;
      count -= take;
    }
    return true;
  }

  bool run_part(uint32_t run, uint64_t offset, uint64_t bytes) override {
    while (bytes > 0) {
      size_t room = 0;
      uint8_t* at = out_.space(&room);
      const size_t take = size_t(std::min<uint64_t>(bytes, room));
      if (take == 0) return output_failed();
      kvpark_status s = KVPARK_OK;
      if (run < blocks_)
        s = kvpark_plan_read_block(plan_, run, offset, at, take);
      else if (tail_body_ != nullptr)
        std::memcpy(at, tail_body_ + offset, take);
      else
        s = kvpark_plan_read_snapshot(plan_, sizeof(SealedPayloadHeader) + offset, at, take);
      if (s != KVPARK_OK) {
        corrupt_ = s == KVPARK_CORRUPT;
        refused_ = corrupt_ ? sealed_payload_check_string(SealedPayloadCheck::bad_checksum)
                            : kvpark_status_string(s);
        return false;
      }
      if (!out_.filled(take)) return output_failed();
      offset += take;
      bytes -= take;
    }
    return true;
  }

  const std::string& refused() const { return refused_; }
  bool corrupt() const { return corrupt_; }

 private:
  bool output_failed() {
    refused_ = out_.why();
    return false;
  }

  kvpark_plan* const plan_;
  const size_t blocks_;
  const uint8_t* const tail_body_;
  ImageOutput& out_;
  std::string refused_;
  bool corrupt_ = false;
};

}  // namespace

uint64_t BlockShape::tail_payload_bytes(uint32_t tail_cells) const {
  return sizeof(SealedPayloadHeader) + uint64_t(tail_cells) * layout.token_kv_bytes();
}

StateLayout placement_neutral(StateLayout layout) {
  layout.stream_index = 0;
  layout.cell_seq_id = 0;
  layout.source_seq_id = 0;
  return layout;
}

kvpark_hash128 block_namespace(kvpark_hash128 base, const StateLayout& layout,
                               uint32_t block_tokens) {
  const StateLayout l = placement_neutral(layout);
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
  for (const LayerLayout& layer : l.layers) {
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

std::shared_ptr<const BlockShape> make_block_shape(const StateLayout& layout,
                                                   kvpark_hash128 base) {
  auto shape = std::make_shared<BlockShape>();
  shape->layout = layout;
  shape->block_bytes = uint64_t(shape->block_tokens) * layout.token_kv_bytes();
  shape->space = block_namespace(base, layout, shape->block_tokens);
  return shape;
}

std::vector<uint8_t> recompose(const StateImage& parsed, std::span<const uint8_t> image,
                               uint32_t cells, uint32_t run_cells) {
  assert(cells <= parsed.cells && run_cells > 0);
  std::vector<std::vector<uint8_t>> runs;
  for (uint32_t first = 0; first < cells; first += run_cells) {
    const uint32_t n = std::min(run_cells, cells - first);
    runs.emplace_back(n * parsed.layout.token_kv_bytes());
    gather_cells(parsed, image.data(), first, n, runs.back().data());
  }
  std::vector<uint8_t> out;
  out.reserve(state_image_bytes(parsed.layout, cells));
  const std::span<const int32_t> tokens =
      parsed.tokens.empty() ? std::span<const int32_t>() : std::span(parsed.tokens.data(), cells);
  write_state_image(
      parsed.layout, tokens, cells, run_cells, [&](uint32_t r) { return runs[r].data(); },
      [&](std::span<const iovec> pieces) {
        for (const iovec& piece : pieces) {
          const auto* p = static_cast<const uint8_t*>(piece.iov_base);
          out.insert(out.end(), p, p + piece.iov_len);
        }
        return true;
      });
  return out;
}

bool check_split(std::span<const uint8_t> image, ImageKind kind, StateImage* ret_parsed,
                 std::string* ret_why) {
  StateImage parsed;
  std::string reason;
  if (!parse_state_image(image, kind, &parsed, &reason)) return refuse(ret_why, reason);
  if (parsed.cells == 0) return refuse(ret_why, "the image holds no cells");
  if (parsed.layout.token_kv_bytes() == 0) return refuse(ret_why, "no KV per token");
  if (!equal(recompose(parsed, image, parsed.cells, state_block_tokens), image) ||
      !equal(recompose(parsed, image, parsed.cells, 1), image))
    return refuse(ret_why, "the image written again from its cells differs");
  *ret_parsed = std::move(parsed);
  return true;
}

uint32_t plan_block_position(kvpark_plan* plan, const BlockShape& shape, uint32_t limit) {
  const size_t blocks =
      std::min<size_t>(kvpark_plan_block_count(plan), limit / shape.block_tokens);
  uint32_t position = uint32_t(blocks) * shape.block_tokens;
  uint32_t tail_at = 0;
  if (kvpark_plan_snapshot_bytes(plan, &tail_at) > 0 && tail_at > position &&
      tail_at - position < shape.block_tokens && tail_at <= limit)
    position = tail_at;
  return position;
}

kvpark_status BlockReservation::reserve(kvpark_client* client,
                                        std::shared_ptr<const BlockShape> shape,
                                        const kvpark_publish_options& options,
                                        const int32_t* tokens, uint32_t position) {
  assert(!reserved() && position > 0);
  const uint32_t block_tokens = shape->block_tokens;
  const size_t blocks = position / block_tokens;
  const uint32_t tail = position % block_tokens;
  bool any = false;  // a block or the tail is this reservation's to write
  for (size_t first = 0; first < blocks; first += limits::reserve_blocks_max) {
    const size_t count = std::min(limits::reserve_blocks_max, blocks - first);
    kvpark_reservation* reservation = nullptr;
    const kvpark_status s =
        kvpark_reserve_blocks(client, &options, tokens, position, first, count, &reservation);
    if (s != KVPARK_OK) {
      abort();
      return s;
    }
    blocks_.push_back(reservation);
    for (size_t i = 0; i < count && !any; ++i)
      any = kvpark_reservation_block(reservation, i) != nullptr;
  }
  kvpark_status tail_status = KVPARK_ALREADY_PRESENT;
  if (tail > 0) {
    tail_status = kvpark_reserve_snapshot(client, &options, tokens, position,
                                          shape->tail_payload_bytes(tail), &tail_);
    if (tail_status == KVPARK_OK) {
      any = true;
    } else if (tail_status != KVPARK_ALREADY_PRESENT && tail_status != KVPARK_IN_FLIGHT) {
      abort();
      return tail_status;
    }
  }
  if (!any) {  // every part parked, or being parked by another
    abort();
    return tail_status;
  }
  shape_ = std::move(shape);
  position_ = position;
  return KVPARK_OK;
}

kvpark_status BlockReservation::fill_and_seal(const StateImage& parsed, const uint8_t* image) {
  assert(reserved() && parsed.cells >= position_ &&
         placement_neutral(parsed.layout) == placement_neutral(shape_->layout));
  const uint32_t block_tokens = shape_->block_tokens;
  size_t block = 0;
  for (kvpark_reservation* r : blocks_) {
    for (size_t i = 0; i < kvpark_reservation_block_count(r); ++i, ++block) {
      // Written in place: kvpark_seal checksums what the arena then holds.
      if (void* dst = kvpark_reservation_block(r, i); dst != nullptr)
        gather_cells(parsed, image, uint32_t(block) * block_tokens, block_tokens,
                     static_cast<uint8_t*>(dst));
    }
  }
  if (tail_ != nullptr) {
    const uint32_t first = uint32_t(block) * block_tokens;
    const uint32_t tail = position_ - first;
    auto* payload = static_cast<uint8_t*>(kvpark_reservation_snapshot(tail_));
    gather_cells(parsed, image, first, tail, payload + sizeof(SealedPayloadHeader));
    sealed_payload_seal(payload, state_tail_magic, position_,
                        uint64_t(tail) * shape_->layout.token_kv_bytes());
  }
  std::vector<kvpark_reservation*> blocks = std::move(blocks_);
  blocks_.clear();
  kvpark_status sealed = KVPARK_OK;
  for (kvpark_reservation* r : blocks) {
    const kvpark_status s = kvpark_seal(r);
    if (sealed == KVPARK_OK) sealed = s;
  }
  if (tail_ != nullptr) {
    const kvpark_status s = sealed == KVPARK_OK ? kvpark_seal(tail_) : kvpark_abort(tail_);
    tail_ = nullptr;
    if (sealed == KVPARK_OK) sealed = s;
  }
  return sealed;
}

void BlockReservation::abort() {
  if (tail_ != nullptr) kvpark_abort(tail_);
  tail_ = nullptr;
  for (kvpark_reservation* r : blocks_) kvpark_abort(r);
  blocks_.clear();
}

uint8_t* MemoryOutput::space(size_t* ret_bytes) {
  *ret_bytes = image_.size() - at_;
  return image_.data() + at_;
}

bool MemoryOutput::filled(size_t bytes) {
  assert(bytes <= image_.size() - at_);
  at_ += bytes;
  return true;
}

bool write_image_from_plan(kvpark_plan* plan, const BlockShape& shape,
                           std::span<const int32_t> tokens, uint32_t position,
                           const uint8_t* tail_body, ImageOutput& out, std::string* ret_refused,
                           bool* ret_corrupt) {
  *ret_corrupt = false;
  const size_t blocks =
      std::min<size_t>(kvpark_plan_block_count(plan), position / shape.block_tokens);
  const uint32_t tail = position - uint32_t(blocks) * shape.block_tokens;
  assert(tail < shape.block_tokens && position > 0);
  if (tail > 0 && tail_body == nullptr) {
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
      check = sealed_payload_check_header(&header, payload, state_tail_magic, position, &header);
    }
    if (check != SealedPayloadCheck::ok) {
      *ret_refused = std::string("tail snapshot: ") + sealed_payload_check_string(check);
      *ret_corrupt = true;
      return false;
    }
  }
  PlanImage image(plan, blocks, tail_body, out);
  if (!write_state_image(shape.layout, tokens, position, shape.block_tokens, image)) {
    *ret_refused = image.refused();
    *ret_corrupt = image.corrupt();
    return false;
  }
  return true;
}

}  // namespace kvpark::llama
