// llama-server slot files parked as blocks (integrations/llama/state_blocks.h says
// how): the slot-file side of it. The proxy learns the upstream's layout from two
// slot files its round trip saved, writes a restore's slot file from the arena, and
// checks each saved slot file before its blocks are cut from it.
//
// Only layouts the reader splits are parked so (a plain KV cache); any other memory
// (iSWA windows, recurrent state) or anything the self-check finds wrong keeps the
// whole-file path, with the reason shown in /kvpark/status.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "integrations/llama/state_blocks.h"
#include "integrations/llama/state_image.h"

namespace kvpark::proxy {

using llama::block_namespace;
using llama::BlockShape;
using llama::state_block_tokens;
inline constexpr uint64_t slot_tail_magic = llama::state_tail_magic;

// The self-check, on two slot files the upstream saved of one slot at 1 and 2 tokens
// (the first token's KV computed once, so both hold it alike): both parse alike,
// splitting and writing each again gives it byte for byte, and the 1-token file
// written from the 2-token one's first cell is the 1-token file. On success
// *ret_shape is set and *ret_prefix holds that 1-token file, for the upstream to
// restore (the round trip checks llama-server takes a recomposed prefix). false with
// why the slot files stay whole.
bool learn_block_shape(std::span<const uint8_t> one, std::span<const uint8_t> two,
                       kvpark_hash128 base, std::shared_ptr<const BlockShape>* ret_shape,
                       std::vector<uint8_t>* ret_prefix, std::string* ret_why);

// Writes the slot file of tokens[0, position) to path from a plan's blocks and, past
// them, its tail snapshot (when position is not block-aligned). Every part comes out
// of the arena once, through libkvpark's verified reads into the staging buffers of
// a SlotFileWriter (slot_file_writer.h), and goes to the file from there. false with
// why; *ret_corrupt when a payload failed its check (the file is removed either way).
bool write_slot_file_from_blocks(kvpark_plan* plan, const BlockShape& shape,
                                 std::span<const int32_t> tokens, uint32_t position,
                                 const std::string& path, std::string* ret_refused,
                                 bool* ret_corrupt);

// A slot file read in, checked against the shape and the tokens it must hold.
struct SlotImage {
  std::unique_ptr<uint8_t[]> bytes;
  uint64_t size = 0;
  llama::StateImage parsed;
};
enum class SlotImageCheck { ok, unreadable, not_split, other_layout, other_tokens };
// Reads path and checks it holds at least tokens[0, position) in shape's layout; why
// in *ret_why when not ok.
SlotImageCheck read_slot_image(const std::string& path, const BlockShape& shape,
                               std::span<const int32_t> tokens, uint32_t position,
                               SlotImage* ret_image, std::string* ret_why);

}  // namespace kvpark::proxy
