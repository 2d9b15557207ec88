// llama.cpp state parked as blocks: the KV of every block_tokens tokens is one
// content-addressed kvparkd block (the chain hash over its tokens), so a head that
// many conversations share is parked once, and any block-aligned prefix of anything
// parked restores. The tokens past a position's last whole block are a small tail
// snapshot at that exact position. An image (a sequence image or a llama-server slot
// file, state_image.h) is cut into them at park, and written again from them, straight
// from the arena, at restore.
//
// Both users share this: kvpark-proxy (slot files, proxy/state_blocks.h) and the
// llama.cpp integration (sequence images, kvpark_llama.h). Only layouts the reader
// splits are parked so; the caller checks each namespace first (check_split) and parks
// anything else whole. No llama.cpp is linked.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "integrations/llama/state_image.h"

namespace kvpark::llama {

// Tokens per block: small enough that a conversation repeats little of the head's
// last partial block, large enough that an image's pieces stay tens of kilobytes.
inline constexpr uint32_t state_block_tokens = 64;
// The tail snapshot: a sealed payload (proto/sealed_payload.h) whose body is the KV
// of the cells past the last whole block, laid out as gather_cells lays it.
inline constexpr uint64_t state_tail_magic = 0x314c544b5241504bull;  // "KPARKTL1"

struct BlockShape {
  StateLayout layout;  // of the images parked
  uint32_t block_tokens = state_block_tokens;
  uint64_t block_bytes = 0;  // one block's KV, every layer
  kvpark_hash128 space{};    // the namespace blocks are parked in
  uint64_t tail_payload_bytes(uint32_t tail_cells) const;
};

// The layout with where the cells sat cleared (the stream and sequence): an image
// restores into any sequence, so blocks parked from one serve every one.
StateLayout placement_neutral(StateLayout layout);

// The namespace of blocks of `layout` under the caller's namespace `base`: another
// layout or block size is another namespace.
kvpark_hash128 block_namespace(kvpark_hash128 base, const StateLayout& layout,
                               uint32_t block_tokens);
std::shared_ptr<const BlockShape> make_block_shape(const StateLayout& layout, kvpark_hash128 base);

// The image of cells [0, cells) written again from parsed's own cells, in runs of
// run_cells: what a restore from blocks of that size gives.
std::vector<uint8_t> recompose(const StateImage& parsed, std::span<const uint8_t> image,
                               uint32_t cells, uint32_t run_cells);

// The self-check of a real image before its namespace parks blocks: it parses, has
// KV per token, and comes out byte for byte when written again from its cells in
// blocks and cell by cell. false with why (the image stays whole).
bool check_split(std::span<const uint8_t> image, ImageKind kind, StateImage* ret_parsed,
                 std::string* ret_why);

// How far a lookup's plan restores in blocks, at most `limit` tokens: its whole blocks
// from 0, then its tail snapshot where one continues them.
uint32_t plan_block_position(kvpark_plan* plan, const BlockShape& shape, uint32_t limit);

// The blocks and tail of one position, reserved in kvparkd: while held, other
// processes' lookups see the tokens in flight. Aborted unless sealed.
class BlockReservation {
 public:
  BlockReservation() = default;
  ~BlockReservation() { abort(); }
  BlockReservation(const BlockReservation&) = delete;
  BlockReservation& operator=(const BlockReservation&) = delete;

  // KVPARK_OK when any block or the tail is this reservation's to write;
  // KVPARK_ALREADY_PRESENT / KVPARK_IN_FLIGHT when every part is parked or being
  // parked by another (nothing held then).
  kvpark_status reserve(kvpark_client* client, std::shared_ptr<const BlockShape> shape,
                        const kvpark_publish_options& options, const int32_t* tokens,
                        uint32_t position);
  bool reserved() const { return tail_ != nullptr || !blocks_.empty(); }
  // Gathers every reserved part from parsed (holding at least the reserved tokens, in
  // the shape's layout) into the arena and seals, blocks first: the tail continues them.
  kvpark_status fill_and_seal(const StateImage& parsed, const uint8_t* image);
  void abort();

 private:
  std::shared_ptr<const BlockShape> shape_;
  std::vector<kvpark_reservation*> blocks_;  // at most limits::reserve_blocks_max each
  kvpark_reservation* tail_ = nullptr;
  uint32_t position_ = 0;
};

// Where a restored image goes, in order: space() offers room for the next bytes
// (none: the output is full), filled() takes the count written there. false from
// filled() ends the image, with why().
class ImageOutput {
 public:
  virtual uint8_t* space(size_t* ret_bytes) = 0;
  virtual bool filled(size_t bytes) = 0;
  virtual std::string why() const { return "the image is larger than its output"; }

 protected:
  ~ImageOutput() = default;
};

// An image in memory, of exactly the bytes it was sized for.
class MemoryOutput final : public ImageOutput {
 public:
  explicit MemoryOutput(std::span<uint8_t> image) : image_(image) {}
  uint8_t* space(size_t* ret_bytes) override;
  bool filled(size_t bytes) override;
  bool complete() const { return at_ == image_.size(); }

 private:
  std::span<uint8_t> image_;
  size_t at_ = 0;
};

// Writes the image of tokens[0, position) (tokens: slot files only) from a plan's
// blocks and, past them, its tail snapshot: every block part comes out of the arena
// once, through libkvpark's verified reads. tail_body: the tail's KV already copied
// out and checked by the caller; nullptr reads it from the plan after checking its
// header. false with why; *ret_corrupt when a payload failed its check.
bool write_image_from_plan(kvpark_plan* plan, const BlockShape& shape,
                           std::span<const int32_t> tokens, uint32_t position,
                           const uint8_t* tail_body, ImageOutput& out, std::string* ret_refused,
                           bool* ret_corrupt);

}  // namespace kvpark::llama
