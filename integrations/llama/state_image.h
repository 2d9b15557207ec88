// llama.cpp sequence state as per-token KV: reads the state images of the pinned
// llama.cpp (the in-memory image of llama_state_seq_get_data_ext, and the slot file
// of llama_state_seq_save_file that llama-server's /slots save writes), gathers the
// KV of any run of cells, and writes the image again for any prefix of its tokens
// from such runs. No llama.cpp is linked: kvpark-proxy uses it on slot files.
//
// Only the layout read in the pinned source and checked on its images is accepted:
// one non-empty stream, cells in position order from 0, one sequence per cell, no
// cell extension, every layer with K and V, and nothing after the attention section
// (an iSWA window or a hybrid's recurrent state is not per token). Anything else is
// refused with the reason, never misread: the caller parks the image whole.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace kvpark::llama {

enum class ImageKind : uint8_t {
  sequence,   // llama_state_seq_get_data_ext: magic, source sequence id, memory
  slot_file,  // llama_state_seq_save_file: 'ggsq', version, token words, memory
};

struct LayerLayout {
  int32_t k_type = 0;  // ggml type, as written
  uint64_t k_row_bytes = 0;
  int32_t v_type = 0;
  uint64_t v_row_bytes = 0;      // V rows (flash attention); transposed: element × width
  uint32_t v_element_bytes = 0;  // transposed V only
  uint32_t v_width = 0;          // transposed V only: elements per token
  bool operator==(const LayerLayout&) const = default;
};

// Everything in an image that is not per token: with a run of cells' KV, enough to
// write the image of any prefix again.
struct StateLayout {
  ImageKind kind = ImageKind::sequence;
  int32_t source_seq_id = 0;    // sequence images: written after the magic, unused on load
  uint32_t slot_version = 0;    // slot files: the container version
  bool packed_tokens = false;   // slot files: llama-server's packed token list
  uint32_t packed_version = 0;  // slot files with packed tokens: its version
  uint32_t stream_count = 0;
  uint32_t stream_index = 0;  // the one stream holding the sequence's cells
  int32_t cell_seq_id = 0;    // the sequence every cell belongs to
  bool v_transposed = false;
  std::vector<LayerLayout> layers;

  uint64_t token_kv_bytes() const;  // KV bytes per cell, all layers, K and V
  bool operator==(const StateLayout&) const = default;
};

// A parsed image: its layout, its cells, its tokens, and where each layer's KV lies.
struct StateImage {
  StateLayout layout;
  uint32_t cells = 0;               // cell i holds position i
  std::vector<int32_t> tokens;      // slot files: one per cell
  std::vector<uint64_t> k_offsets;  // per layer: its first K byte in the image
  std::vector<uint64_t> v_offsets;  // per layer: its first V byte (transposed: column 0)
};

// Parses image as kind; false, with why in ret_reason, for any image this reader does
// not split (truncated, inconsistent, or of a layout it does not know). Never reads
// outside image.
bool parse_state_image(std::span<const uint8_t> image, ImageKind kind, StateImage* ret_image,
                       std::string* ret_reason);

// Copies the KV of cells [first, first + count) out of the parsed image into out
// (count × token_kv_bytes()): every layer's K rows, then every layer's V rows (V
// transposed: per layer, per element, the count cells' values).
void gather_cells(const StateImage& parsed, const uint8_t* image, uint32_t first, uint32_t count,
                  uint8_t* out);

// The size of the image of `cells` cells (and as many tokens, for slot files).
uint64_t state_image_bytes(const StateLayout& layout, uint32_t cells);

// Writes, in order through sink, the image of cells [0, cells) holding tokens (slot
// files: cells of them; ignored for sequence images). The KV comes in runs of
// run_cells cells, as gather_cells lays them out: run(r) is the KV of cells
// [r × run_cells, min(cells, (r + 1) × run_cells)), and must stay valid until
// write_state_image returns. The sink gets the image in order, in batches of at
// most IOV_MAX pieces (writev); false if it refuses one.
using ImageSink = std::function<bool(std::span<const iovec> pieces)>;
bool write_state_image(const StateLayout& layout, std::span<const int32_t> tokens, uint32_t cells,
                       uint32_t run_cells, const std::function<const uint8_t*(uint32_t run)>& run,
                       const ImageSink& sink);

// The image's parts, for a writer that fetches the runs' KV itself (kvpark-proxy
// reads each run from kvparkd's arena, verifying as it copies): own() gets the
// image's own bytes (headers, cell metadata, tokens; valid during the call only),
// run_part() asks for bytes [offset, offset + bytes) of run r's KV, laid out as
// gather_cells lays it. Parts come in image order, so each run's parts come in order
// of offset, from 0 to its end. false from either ends the image.
class ImageParts {
 public:
  virtual bool own(const uint8_t* bytes, size_t count) = 0;
  virtual bool run_part(uint32_t run, uint64_t offset, uint64_t bytes) = 0;

 protected:
  ~ImageParts() = default;
};
bool write_state_image(const StateLayout& layout, std::span<const int32_t> tokens, uint32_t cells,
                       uint32_t run_cells, ImageParts& parts);

}  // namespace kvpark::llama
