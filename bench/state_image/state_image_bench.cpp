// kvpark-state-image-bench: what splitting a llama.cpp slot file into blocks and
// writing one again from blocks costs (integrations/llama/state_image.h), against
// references measured in the same run on the same bytes:
//   - decompose (parse, then gather every 64-token block) against memcpy of the file;
//   - recompose into a file (the slot directory; tmpfs by default, as a restore
//     writes it) against write() of the same bytes to the same file.
// The image has the realistic geometry of the test model kvpark-make-test-model
// --layers 32 --embedding 1024 serves (f16 K and V, 512 wide: 64 KiB of KV per
// token), with V as rows (flash attention) and transposed (without).
//
//   kvpark-state-image-bench [--quick] [--tokens N] [--dir DIR]
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "integrations/llama/state_image.h"

namespace {

using kvpark::llama::ImageKind;
using kvpark::llama::LayerLayout;
using kvpark::llama::StateImage;
using kvpark::llama::StateLayout;
using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

constexpr uint32_t block_tokens = 64;
constexpr uint32_t layers = 32;
constexpr uint32_t kv_width = 512;  // elements per token per layer, K and V each
constexpr uint32_t f16_bytes = 2;
constexpr int32_t ggml_type_f16 = 1;
constexpr int repeats = 5;

StateLayout slot_layout(bool v_transposed) {
  StateLayout layout{.kind = ImageKind::slot_file,
                     .slot_version = 3,
                     .packed_tokens = true,
                     .packed_version = 1,
                     .stream_count = 1,
                     .v_transposed = v_transposed};
  const uint64_t row = uint64_t(kv_width) * f16_bytes;
  layout.layers.assign(layers, LayerLayout{.k_type = ggml_type_f16,
                                           .k_row_bytes = row,
                                           .v_type = ggml_type_f16,
                                           .v_row_bytes = row,
                                           .v_element_bytes = v_transposed ? f16_bytes : 0,
                                           .v_width = v_transposed ? kv_width : 0});
  return layout;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename F>
double median_seconds(int runs, F&& f) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const auto start = Clock::now();
    f();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// The pieces in one writev when the file takes them whole, as a tmpfs does.
bool writev_all(int fd, std::span<const iovec> pieces) {
  size_t bytes = 0;
  for (const iovec& piece : pieces) bytes += piece.iov_len;
  const ssize_t w = writev(fd, pieces.data(), int(pieces.size()));
  if (w == ssize_t(bytes)) return true;
  if (w < 0) return false;
  size_t skip = size_t(w);  // a short write: the rest piece by piece
  for (const iovec& piece : pieces) {
    const size_t done = std::min(skip, piece.iov_len);
    skip -= done;
    if (!write_all(fd, static_cast<const uint8_t*>(piece.iov_base) + done, piece.iov_len - done))
      return false;
  }
  return true;
}

bool run(bool v_transposed, uint32_t tokens, const std::string& dir, int runs) {
  const StateLayout layout = slot_layout(v_transposed);
  std::vector<int32_t> token_ids(tokens);
  for (uint32_t i = 0; i < tokens; ++i) token_ids[i] = int32_t(i % 32000);
  // The file llama-server would have saved, written from random KV.
  const uint32_t block_count = (tokens + block_tokens - 1) / block_tokens;
  std::vector<Bytes> blocks(block_count, Bytes(block_tokens * layout.token_kv_bytes()));
  std::mt19937_64 random(1);
  for (Bytes& block : blocks)
    for (size_t i = 0; i + 8 <= block.size(); i += 8) {
      const uint64_t v = random();
      std::memcpy(block.data() + i, &v, 8);
    }
  Bytes file;
  file.reserve(kvpark::llama::state_image_bytes(layout, tokens));
  auto run_of = [&](uint32_t r) { return blocks[r].data(); };
  auto to_memory = [&](std::span<const iovec> pieces) {
    for (const iovec& piece : pieces) {
      const auto* p = static_cast<const uint8_t*>(piece.iov_base);
      file.insert(file.end(), p, p + piece.iov_len);
    }
    return true;
  };
  if (!kvpark::llama::write_state_image(layout, token_ids, tokens, block_tokens, run_of, to_memory))
    return false;

  Bytes copy(file.size());
  const double memcpy_s =
      median_seconds(runs, [&] { std::memcpy(copy.data(), file.data(), file.size()); });
  StateImage parsed;
  std::string why;
  std::vector<Bytes> gathered(block_count, Bytes(block_tokens * layout.token_kv_bytes()));
  bool ok = true;
  const double decompose_s = median_seconds(runs, [&] {
    ok = ok && kvpark::llama::parse_state_image(file, ImageKind::slot_file, &parsed, &why);
    for (uint32_t b = 0; ok && b < block_count; ++b)
      kvpark::llama::gather_cells(parsed, file.data(), b * block_tokens,
                                  std::min(block_tokens, tokens - b * block_tokens),
                                  gathered[b].data());
  });
  if (!ok || gathered != blocks) {
    std::fprintf(stderr, "decompose failed: %s\n", why.c_str());
    return false;
  }

  const std::string path = dir + "/kvpark-state-image-bench." + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ok = write_all(fd, file.data(), file.size());  // allocates the file's pages once
  // Both overwrite the file in place from its start, as kvpark-proxy writes a slot file.
  const double write_s = median_seconds(runs, [&] {
    ok = ok && lseek(fd, 0, SEEK_SET) == 0 && write_all(fd, file.data(), file.size());
  });
  const double recompose_s = median_seconds(runs, [&] {
    ok =
        ok && lseek(fd, 0, SEEK_SET) == 0 &&
        kvpark::llama::write_state_image(
            layout, token_ids, tokens, block_tokens, [&](uint32_t r) { return gathered[r].data(); },
            [&](std::span<const iovec> pieces) { return writev_all(fd, pieces); });
  });
  Bytes written(file.size());
  ok = ok && pread(fd, written.data(), written.size(), 0) == ssize_t(written.size()) &&
       written == file;
  close(fd);
  unlink(path.c_str());
  if (!ok) {
    std::fprintf(stderr, "recompose into %s failed or differs\n", path.c_str());
    return false;
  }
  const double mib = double(file.size()) / (1 << 20);
  std::printf(
      "%-11s %6u tokens %8.1f MiB | memcpy %7.1f ms  decompose %7.1f ms (%.2fx)"
      " | write() %7.1f ms  recompose %7.1f ms (%.2fx)\n",
      v_transposed ? "V transposed" : "V rows", tokens, mib, memcpy_s * 1e3, decompose_s * 1e3,
      decompose_s / memcpy_s, write_s * 1e3, recompose_s * 1e3, recompose_s / write_s);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint32_t tokens = 4096;
  std::string dir = "/dev/shm";
  int runs = repeats;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      tokens = 256;
      runs = 1;
    } else if (arg == "--tokens" && i + 1 < argc) {
      tokens = uint32_t(std::strtoul(argv[++i], nullptr, 10));
    } else if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--tokens N] [--dir DIR]\n", argv[0]);
      return 2;
    }
  }
  if (tokens == 0) return 2;
  std::printf("state images: %u layers, %u-wide f16 K and V, %u-token blocks; medians of %d\n",
              layers, kv_width, block_tokens, runs);
  const bool ok = run(false, tokens, dir, runs) && run(true, tokens, dir, runs);
  return ok ? 0 : 1;
}
