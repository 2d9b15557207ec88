#include "integrations/llama/state_image.h"

#include <cassert>
#include <cstring>

namespace kvpark::llama {
namespace {

// What the pinned llama.cpp writes (llama-context.cpp, llama-kv-cache.cpp, and
// llama-server's server-common.cpp for the token words).
constexpr uint32_t sequence_image_magic = 0xaf143cd8;  // io_magic
constexpr uint32_t slot_file_magic = 0x67677371;       // LLAMA_FILE_MAGIC_GGSQ
constexpr uint32_t slot_file_version = 3;              // LLAMA_STATE_SEQ_VERSION
constexpr int32_t packed_tokens_marker = -1;           // LLAMA_TOKEN_NULL
constexpr uint32_t packed_tokens_version = 1;          // SERVER_TOKENS_STATE_VERSION
// Words of a packed token list besides the tokens: marker, version, token count,
// media key count.
constexpr uint32_t packed_tokens_overhead_words = 4;
// Per cell: position, sequence count (1), the sequence id.
constexpr uint64_t cell_meta_bytes = 12;
// Bounds far beyond any model, so that a corrupt count is refused before it sizes
// anything.
constexpr uint32_t max_streams = 4096;
constexpr uint32_t max_layers = 4096;
// The writer's staging for small pieces (headers, cells, and transposed V, which
// comes in one piece per element and run); pieces from this size on go by reference.
constexpr size_t staging_bytes = 256u << 10;
constexpr size_t copy_below_bytes = 4u << 10;
constexpr size_t max_pieces = 1024;  // IOV_MAX

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  template <typename T>
  bool read(T* value) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(value, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool skip(uint64_t n) {
    if (remaining() < n) return false;
    at_ += n;
    return true;
  }
  uint64_t at() const { return at_; }
  uint64_t remaining() const { return bytes_.size() - at_; }

 private:
  std::span<const uint8_t> bytes_;
  uint64_t at_ = 0;
};

bool refuse(std::string* ret_reason, std::string reason) {
  *ret_reason = std::move(reason);
  return false;
}

// n rows of row_bytes fit in what is left (without overflowing the product).
bool fits(const Reader& r, uint64_t n, uint64_t row_bytes) {
  return row_bytes != 0 && n <= r.remaining() / row_bytes;
}

bool parse_slot_words(Reader& r, StateImage* image, std::string* ret_reason) {
  StateLayout& layout = image->layout;
  uint32_t magic = 0, words = 0;
  if (!r.read(&magic) || !r.read(&layout.slot_version) || !r.read(&words))
    return refuse(ret_reason, "truncated slot file header");
  if (magic != slot_file_magic) return refuse(ret_reason, "not a slot file (magic)");
  if (layout.slot_version != slot_file_version)
    return refuse(ret_reason, "slot file version " + std::to_string(layout.slot_version));
  if (!fits(r, words, sizeof(int32_t))) return refuse(ret_reason, "truncated token list");
  std::vector<int32_t> w(words);
  for (int32_t& word : w) r.read(&word);
  if (w.empty() || w[0] != packed_tokens_marker) {  // a plain token list
    image->tokens = std::move(w);
    return true;
  }
  // Marker, version, token count, the tokens, media key count.
  layout.packed_tokens = true;
  if (words < packed_tokens_overhead_words)
    return refuse(ret_reason, "truncated packed token list");
  layout.packed_version = uint32_t(w[1]);
  if (layout.packed_version != packed_tokens_version)
    return refuse(ret_reason, "packed token list version " + std::to_string(layout.packed_version));
  if (uint32_t(w[2]) != words - packed_tokens_overhead_words)
    return refuse(ret_reason, "packed token list holds media or other words");
  if (w.back() != 0) return refuse(ret_reason, "packed token list holds media chunks");
  image->tokens.assign(w.begin() + 3, w.end() - 1);
  return true;
}

bool parse_cells(Reader& r, uint32_t cells, StateImage* image, std::string* ret_reason) {
  if (!fits(r, cells, cell_meta_bytes)) return refuse(ret_reason, "truncated cells");
  for (uint32_t i = 0; i < cells; ++i) {
    int32_t position = 0, seq_id = 0;
    uint32_t seq_count = 0;
    r.read(&position);
    r.read(&seq_count);
    r.read(&seq_id);
    if (position != int32_t(i))
      return refuse(ret_reason, "cells not in position order from 0 (or with extensions)");
    if (seq_count != 1) return refuse(ret_reason, "a cell in more than one sequence");
    if (i == 0) image->layout.cell_seq_id = seq_id;
    if (seq_id != image->layout.cell_seq_id) return refuse(ret_reason, "cells of two sequences");
  }
  return true;
}

bool parse_layers(Reader& r, uint32_t cells, StateImage* image, std::string* ret_reason) {
  StateLayout& layout = image->layout;
  uint32_t v_transposed = 0, layer_count = 0;
  if (!r.read(&v_transposed) || !r.read(&layer_count))
    return refuse(ret_reason, "truncated layer header");
  if (v_transposed > 1) return refuse(ret_reason, "v_trans " + std::to_string(v_transposed));
  if (layer_count == 0 || layer_count > max_layers)
    return refuse(ret_reason, "layer count " + std::to_string(layer_count));
  layout.v_transposed = v_transposed == 1;
  layout.layers.resize(layer_count);
  for (LayerLayout& layer : layout.layers) {
    if (!r.read(&layer.k_type) || !r.read(&layer.k_row_bytes))
      return refuse(ret_reason, "truncated K header");
    image->k_offsets.push_back(r.at());
    if (!fits(r, cells, layer.k_row_bytes) || !r.skip(cells * layer.k_row_bytes))
      return refuse(ret_reason, "truncated K rows");
  }
  for (LayerLayout& layer : layout.layers) {
    if (!r.read(&layer.v_type)) return refuse(ret_reason, "truncated V header");
    if (layout.v_transposed) {
      if (!r.read(&layer.v_element_bytes) || !r.read(&layer.v_width))
        return refuse(ret_reason, "truncated V header");
      layer.v_row_bytes = uint64_t(layer.v_element_bytes) * layer.v_width;
    } else if (!r.read(&layer.v_row_bytes)) {
      return refuse(ret_reason, "truncated V header");
    }
    image->v_offsets.push_back(r.at());
    if (!fits(r, cells, layer.v_row_bytes) || !r.skip(cells * layer.v_row_bytes))
      return refuse(ret_reason, "truncated V");
  }
  return true;
}

// Hands the image to the sink in large vectored writes: large pieces by reference
// (the runs outlive the write), small ones copied together into a staging buffer.
class VectoredWriter {
 public:
  explicit VectoredWriter(const ImageSink& sink) : sink_(sink) {
    staging_.reserve(staging_bytes);
    pieces_.reserve(max_pieces);
  }
  // A refused write makes every later put a no-op; flush() says so.
  void put(const void* data, size_t bytes) {
    if (!ok_ || bytes == 0) return;
    if (pieces_.size() == max_pieces ||
        (bytes < copy_below_bytes && staging_.size() + bytes > staging_bytes)) {
      if (!flush()) return;
    }
    if (bytes >= copy_below_bytes) {
      pieces_.push_back({const_cast<void*>(data), bytes});
      return;
    }
    uint8_t* at = staging_.data() + staging_.size();
    const auto* p = static_cast<const uint8_t*>(data);
    staging_.insert(staging_.end(), p, p + bytes);  // within capacity: no reallocation
    if (!pieces_.empty() &&
        static_cast<uint8_t*>(pieces_.back().iov_base) + pieces_.back().iov_len == at)
      pieces_.back().iov_len += bytes;
    else
      pieces_.push_back({at, bytes});
  }
  template <typename T>
  void put(T value) {
    put(&value, sizeof value);
  }
  bool flush() {
    if (ok_ && !pieces_.empty()) ok_ = sink_(pieces_);
    pieces_.clear();
    staging_.clear();
    return ok_;
  }

 private:
  const ImageSink& sink_;
  std::vector<uint8_t> staging_;
  std::vector<iovec> pieces_;
  bool ok_ = true;
};

}  // namespace

uint64_t StateLayout::token_kv_bytes() const {
  uint64_t bytes = 0;
  for (const LayerLayout& layer : layers) bytes += layer.k_row_bytes + layer.v_row_bytes;
  return bytes;
}

bool parse_state_image(std::span<const uint8_t> bytes, ImageKind kind, StateImage* ret_image,
                       std::string* ret_reason) {
  StateImage image;
  image.layout.kind = kind;
  Reader r(bytes);
  if (kind == ImageKind::sequence) {
    uint32_t magic = 0;
    if (!r.read(&magic) || !r.read(&image.layout.source_seq_id))
      return refuse(ret_reason, "truncated image header");
    if (magic != sequence_image_magic) return refuse(ret_reason, "not a sequence image (magic)");
  } else if (!parse_slot_words(r, &image, ret_reason)) {
    return false;
  }
  uint32_t streams = 0;
  if (!r.read(&streams)) return refuse(ret_reason, "truncated stream count");
  if (streams == 0 || streams > max_streams)
    return refuse(ret_reason, "stream count " + std::to_string(streams));
  image.layout.stream_count = streams;
  bool found = false;
  for (uint32_t s = 0; s < streams; ++s) {
    uint32_t cells = 0;
    if (!r.read(&cells)) return refuse(ret_reason, "truncated stream");
    if (cells == 0) continue;
    if (found) return refuse(ret_reason, "cells in two streams");
    found = true;
    image.layout.stream_index = s;
    image.cells = cells;
    if (!parse_cells(r, cells, &image, ret_reason) || !parse_layers(r, cells, &image, ret_reason))
      return false;
  }
  if (!found) return refuse(ret_reason, "no cells");
  if (r.remaining() != 0)
    return refuse(ret_reason,
                  "a section follows the attention cache (SWA window, recurrent "
                  "state, or a layout this reader does not know)");
  if (kind == ImageKind::slot_file && image.tokens.size() != image.cells)
    return refuse(ret_reason, "the token list and the cells differ in length");
  *ret_image = std::move(image);
  return true;
}

void gather_cells(const StateImage& parsed, const uint8_t* image, uint32_t first, uint32_t count,
                  uint8_t* out) {
  assert(uint64_t(first) + count <= parsed.cells);
  const StateLayout& layout = parsed.layout;
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    const uint64_t row = layout.layers[l].k_row_bytes;
    std::memcpy(out, image + parsed.k_offsets[l] + first * row, count * row);
    out += count * row;
  }
  for (size_t l = 0; l < layout.layers.size(); ++l) {
    const LayerLayout& layer = layout.layers[l];
    if (!layout.v_transposed) {
      std::memcpy(out, image + parsed.v_offsets[l] + first * layer.v_row_bytes,
                  count * layer.v_row_bytes);
      out += count * layer.v_row_bytes;
      continue;
    }
    const uint64_t element = layer.v_element_bytes;
    for (uint32_t j = 0; j < layer.v_width; ++j) {
      const uint64_t column = parsed.v_offsets[l] + uint64_t(j) * parsed.cells * element;
      std::memcpy(out, image + column + first * element, count * element);
      out += count * element;
    }
  }
}

uint64_t state_image_bytes(const StateLayout& layout, uint32_t cells) {
  uint64_t bytes = 0;
  if (layout.kind == ImageKind::sequence) {
    bytes += 2 * sizeof(uint32_t);
  } else {
    const uint64_t words = layout.packed_tokens ? cells + packed_tokens_overhead_words : cells;
    bytes += 3 * sizeof(uint32_t) + words * sizeof(int32_t);
  }
  bytes += sizeof(uint32_t) * (1 + uint64_t(layout.stream_count));  // count, cells per stream
  bytes += cells * cell_meta_bytes + 2 * sizeof(uint32_t);          // cells, v_trans, layers
  const uint64_t v_header =
      layout.v_transposed ? 3 * sizeof(uint32_t) : sizeof(int32_t) + sizeof(uint64_t);
  bytes += layout.layers.size() * (sizeof(int32_t) + sizeof(uint64_t) + v_header);
  return bytes + cells * layout.token_kv_bytes();
}

namespace {

// Emits the image of cells [0, cells) to out: out.put(bytes, n) and out.put(value)
// for the image's own bytes, out.run_part(r, offset, n) for KV bytes of run r (in
// order of offset within each run).
template <typename Out>
void emit_state_image(const StateLayout& layout, std::span<const int32_t> tokens, uint32_t cells,
                      uint32_t run_cells, Out& out) {
  assert(cells > 0 && run_cells > 0);
  assert(layout.kind == ImageKind::sequence || tokens.size() == cells);
  if (layout.kind == ImageKind::sequence) {
    out.put(sequence_image_magic);
    out.put(layout.source_seq_id);
  } else {
    out.put(slot_file_magic);
    out.put(layout.slot_version);
    if (layout.packed_tokens) {
      out.put(uint32_t(cells + packed_tokens_overhead_words));
      out.put(packed_tokens_marker);
      out.put(layout.packed_version);
      out.put(uint32_t(cells));
    } else {
      out.put(uint32_t(cells));
    }
    out.put(tokens.data(), tokens.size_bytes());
    if (layout.packed_tokens) out.put(uint32_t(0));  // no media
  }
  out.put(layout.stream_count);
  const uint32_t runs = (cells + run_cells - 1) / run_cells;
  // Calls piece(run, cells in it), for each run in order.
  auto each_run = [&](auto&& piece) {
    for (uint32_t r = 0; r < runs; ++r) piece(r, uint64_t(std::min(run_cells, cells - r * run_cells)));
  };
  for (uint32_t s = 0; s < layout.stream_count; ++s) {
    if (s != layout.stream_index) {
      out.put(uint32_t(0));
      continue;
    }
    out.put(cells);
    for (uint32_t i = 0; i < cells; ++i) {
      const int32_t cell[3] = {int32_t(i), 1, layout.cell_seq_id};  // position, seqs, seq id
      out.put(cell, sizeof cell);
    }
    out.put(uint32_t(layout.v_transposed ? 1 : 0));
    out.put(uint32_t(layout.layers.size()));
    uint64_t k_before = 0;  // K bytes per cell of the layers before this one
    for (const LayerLayout& layer : layout.layers) {
      out.put(layer.k_type);
      out.put(layer.k_row_bytes);
      each_run([&](uint32_t r, uint64_t n) { out.run_part(r, n * k_before, n * layer.k_row_bytes); });
      k_before += layer.k_row_bytes;
    }
    uint64_t v_before = 0;
    for (const LayerLayout& layer : layout.layers) {
      out.put(layer.v_type);
      if (layout.v_transposed) {
        out.put(layer.v_element_bytes);
        out.put(layer.v_width);
        for (uint32_t j = 0; j < layer.v_width; ++j) {
          each_run([&](uint32_t r, uint64_t n) {
            const uint64_t column = n * (k_before + v_before) + j * n * layer.v_element_bytes;
            out.run_part(r, column, n * layer.v_element_bytes);
          });
        }
      } else {
        out.put(layer.v_row_bytes);
        each_run([&](uint32_t r, uint64_t n) {
          out.run_part(r, n * (k_before + v_before), n * layer.v_row_bytes);
        });
      }
      v_before += layer.v_row_bytes;
    }
  }
}

// The runs in memory, as iovecs through an ImageSink.
struct RunPointerWriter : VectoredWriter {
  RunPointerWriter(const ImageSink& sink, std::vector<const uint8_t*> runs)
      : VectoredWriter(sink), runs(std::move(runs)) {}
  void run_part(uint32_t r, uint64_t offset, uint64_t bytes) { put(runs[r] + offset, bytes); }
  std::vector<const uint8_t*> runs;
};

// The runs fetched by the caller, through ImageParts; a refusal ends the image.
struct PartsWriter {
  ImageParts& parts;
  bool ok = true;
  void put(const void* data, size_t bytes) {
    if (ok && bytes > 0) ok = parts.own(static_cast<const uint8_t*>(data), bytes);
  }
  template <typename T>
  void put(T value) {
    put(&value, sizeof value);
  }
  void run_part(uint32_t r, uint64_t offset, uint64_t bytes) {
    if (ok && bytes > 0) ok = parts.run_part(r, offset, bytes);
  }
};

}  // namespace

bool write_state_image(const StateLayout& layout, std::span<const int32_t> tokens, uint32_t cells,
                       uint32_t run_cells, const std::function<const uint8_t*(uint32_t run)>& run,
                       const ImageSink& sink) {
  std::vector<const uint8_t*> runs((cells + run_cells - 1) / run_cells);
  for (uint32_t r = 0; r < runs.size(); ++r) runs[r] = run(r);
  RunPointerWriter out(sink, std::move(runs));
  emit_state_image(layout, tokens, cells, run_cells, out);
  return out.flush();
}

bool write_state_image(const StateLayout& layout, std::span<const int32_t> tokens, uint32_t cells,
                       uint32_t run_cells, ImageParts& parts) {
  PartsWriter out{parts};
  emit_state_image(layout, tokens, cells, run_cells, out);
  return out.ok;
}

}  // namespace kvpark::llama
