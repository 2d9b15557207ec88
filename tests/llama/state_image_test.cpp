// The state-image reader/writer (integrations/llama/state_image.h) on real images of
// the pinned llama.cpp, made here from the project's test models: flash attention on
// and off, f16 and q8_0 KV, one and two streams, sequence images and slot files; and
// kvpark-proxy's self-check on such slot files (proxy/state_blocks.h).
//   - An image written again from its cells' KV, in runs of any length, is the image.
//   - The image of a prefix written from runs is byte for byte what llama.cpp holds
//     after loading the whole image and removing the rest (llama-server's way of
//     using a longer state), llama.cpp loads it, and saves it back unchanged.
//   - Truncated, altered and unknown images (an iSWA window, a hybrid's recurrent
//     state) are refused with a reason, never misread.
#include <ggml-backend.h>
#include <gtest/gtest.h>
#include <llama.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "integrations/llama/gguf_writer.h"
#include "integrations/llama/state_blocks.h"
#include "integrations/llama/state_image.h"
#include "proxy/state_blocks.h"

namespace kvpark::llama {
namespace {

constexpr uint32_t prompt_tokens = 200;
constexpr uint32_t block_tokens = 64;
constexpr uint32_t context_tokens = 512;

using Bytes = std::vector<uint8_t>;

struct Cache {
  const char* name;
  ggml_type k, v;
  bool flash;
  uint32_t sequences;  // > 1: one stream per sequence, the state in the last
};
const Cache caches[] = {
    {"f16", GGML_TYPE_F16, GGML_TYPE_F16, false, 1},  // V transposed
    {"f16_flash", GGML_TYPE_F16, GGML_TYPE_F16, true, 1},
    {"q8_0_flash", GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, true, 1},
    {"q8_0_k", GGML_TYPE_Q8_0, GGML_TYPE_F16, false, 1},
    {"f16_two_streams", GGML_TYPE_F16, GGML_TYPE_F16, false, 2},
};

void quiet_log(ggml_log_level, const char*, void*) {}

std::string model_file(TestModelArch arch) {
  return "/tmp/kvpark-state-image." + std::to_string(getpid()) + "." + test_model_arch_name(arch) +
         ".gguf";
}

class Engine {
 public:
  Engine(llama_model* model, const Cache& cache) : cache_(cache) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx = context_tokens * cache.sequences;
    p.n_batch = p.n_ubatch = context_tokens;
    p.n_seq_max = cache.sequences;
    p.kv_unified = cache.sequences == 1;
    p.n_threads = p.n_threads_batch = 2;
    p.flash_attn_type =
        cache.flash ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    p.type_k = cache.k;
    p.type_v = cache.v;
    ctx_ = llama_init_from_model(model, p);
  }
  ~Engine() { llama_free(ctx_); }
  bool ready() const { return ctx_ != nullptr; }
  llama_seq_id seq() const { return llama_seq_id(cache_.sequences - 1); }

  bool prefill(const std::vector<llama_token>& tokens) {
    llama_batch batch = llama_batch_init(int32_t(tokens.size()), 0, 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      batch.token[i] = tokens[i];
      batch.pos[i] = llama_pos(i);
      batch.n_seq_id[i] = 1;
      batch.seq_id[i][0] = seq();
      batch.logits[i] = i + 1 == tokens.size();
    }
    batch.n_tokens = int32_t(tokens.size());
    const int rc = llama_decode(ctx_, batch);
    llama_batch_free(batch);
    return rc == 0;
  }
  Bytes image() {
    Bytes out(llama_state_seq_get_size_ext(ctx_, seq(), 0));
    out.resize(llama_state_seq_get_data_ext(ctx_, out.data(), out.size(), seq(), 0));
    return out;
  }
  bool load(const Bytes& image) {
    return llama_state_seq_set_data_ext(ctx_, image.data(), image.size(), seq(), 0) == image.size();
  }
  void keep_first(uint32_t n) { llama_memory_seq_rm(llama_get_memory(ctx_), seq(), n, -1); }
  llama_pos last_position() { return llama_memory_seq_pos_max(llama_get_memory(ctx_), seq()); }
  llama_context* ctx() { return ctx_; }

 private:
  Cache cache_;
  llama_context* ctx_ = nullptr;
};

std::vector<llama_token> prompt(uint32_t n) {
  std::vector<llama_token> tokens(n);
  for (uint32_t i = 0; i < n; ++i) tokens[i] = llama_token(3 + (i * 7919) % 250);
  return tokens;
}

// The image's cells gathered in blocks of block_tokens (the last one shorter).
std::vector<Bytes> blocks_of(const StateImage& parsed, const Bytes& image, uint32_t cells) {
  std::vector<Bytes> blocks;
  for (uint32_t first = 0; first < cells; first += block_tokens) {
    const uint32_t n = std::min(block_tokens, cells - first);
    Bytes block(n * parsed.layout.token_kv_bytes());
    gather_cells(parsed, image.data(), first, n, block.data());
    blocks.push_back(std::move(block));
  }
  return blocks;
}

Bytes write_image(const StateLayout& layout, const std::vector<int32_t>& tokens, uint32_t cells,
                  const std::vector<Bytes>& blocks) {
  Bytes out;
  const bool ok = write_state_image(
      layout, std::span(tokens.data(), layout.kind == ImageKind::slot_file ? cells : 0), cells,
      block_tokens, [&](uint32_t r) { return blocks[r].data(); },
      [&](std::span<const iovec> pieces) {
        for (const iovec& piece : pieces) {
          const auto* p = static_cast<const uint8_t*>(piece.iov_base);
          out.insert(out.end(), p, p + piece.iov_len);
        }
        return true;
      });
  EXPECT_TRUE(ok);
  EXPECT_EQ(out.size(), state_image_bytes(layout, cells));
  // The same image through ImageParts (the writer that fetches runs itself) asks for
  // each run's bytes once, in order of offset, and writes the same bytes.
  struct Parts : ImageParts {
    const std::vector<Bytes>& blocks;
    std::vector<uint64_t> read;  // per run, bytes asked for so far
    Bytes image;
    explicit Parts(const std::vector<Bytes>& b) : blocks(b), read(b.size(), 0) {}
    bool own(const uint8_t* bytes, size_t count) override {
      image.insert(image.end(), bytes, bytes + count);
      return true;
    }
    bool run_part(uint32_t run, uint64_t offset, uint64_t bytes) override {
      EXPECT_EQ(offset, read[run]) << "run " << run;
      read[run] = offset + bytes;
      image.insert(image.end(), blocks[run].begin() + offset, blocks[run].begin() + offset + bytes);
      return true;
    }
  } parts(blocks);
  EXPECT_TRUE(write_state_image(
      layout, std::span(tokens.data(), layout.kind == ImageKind::slot_file ? cells : 0), cells,
      block_tokens, parts));
  for (size_t r = 0; r < blocks.size(); ++r) EXPECT_EQ(parts.read[r], blocks[r].size()) << r;
  EXPECT_TRUE(parts.image == out);
  return out;
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// llama.cpp and a test model of every family, for every test.
class Models : public ::testing::Environment {
 public:
  void SetUp() override {
    llama_log_set(quiet_log, nullptr);
    if (const char* dir = std::getenv("KVPARK_LLAMA_BACKENDS"); dir != nullptr && *dir != 0)
      ggml_backend_load_all_from_path(dir);
    llama_backend_init();
    for (TestModelArch arch : test_model_arches) {
      // 64-wide heads: what a q8_0 cache needs.
      const TestModelOptions options{.arch = arch, .embedding_length = 256};
      ASSERT_EQ(write_test_model(model_file(arch), options), GgufStatus::ok);
    }
  }
  void TearDown() override {
    for (TestModelArch arch : test_model_arches) std::remove(model_file(arch).c_str());
  }
};
[[maybe_unused]] const auto* const models = ::testing::AddGlobalTestEnvironment(new Models);

class StateImageTest : public ::testing::TestWithParam<Cache> {
 protected:
  void SetUp() override {
    llama_model_params p = llama_model_default_params();
    model_ = llama_model_load_from_file(model_file(TestModelArch::llama).c_str(), p);
    ASSERT_NE(model_, nullptr);
    engine_ = std::make_unique<Engine>(model_, GetParam());
    ASSERT_TRUE(engine_->ready());
    ASSERT_TRUE(engine_->prefill(prompt(prompt_tokens)));
    image_ = engine_->image();
    ASSERT_GT(image_.size(), 0u);
  }
  void TearDown() override {
    engine_.reset();
    if (model_ != nullptr) llama_model_free(model_);
  }

  // A slot file of the state, with the token words llama-server writes.
  Bytes slot_file(bool packed) {
    const auto tokens = prompt(prompt_tokens);
    std::vector<llama_token> words = tokens;
    if (packed) {
      words = {-1, 1, llama_token(tokens.size())};
      words.insert(words.end(), tokens.begin(), tokens.end());
      words.push_back(0);  // media keys
    }
    const std::string path = "/tmp/kvpark-state-image." + std::to_string(getpid()) + ".slot";
    EXPECT_GT(llama_state_seq_save_file(engine_->ctx(), path.c_str(), engine_->seq(), words.data(),
                                        words.size()),
              0u);
    Bytes file = read_file(path);
    std::remove(path.c_str());
    return file;
  }

  llama_model* model_ = nullptr;
  std::unique_ptr<Engine> engine_;
  Bytes image_;
};

TEST_P(StateImageTest, AnImageWrittenAgainFromItsBlocksIsTheImage) {
  StateImage parsed;
  std::string why;
  ASSERT_TRUE(parse_state_image(image_, ImageKind::sequence, &parsed, &why)) << why;
  EXPECT_EQ(parsed.cells, prompt_tokens);
  EXPECT_EQ(parsed.layout.v_transposed, !GetParam().flash);
  EXPECT_EQ(parsed.layout.stream_index, GetParam().sequences - 1);
  EXPECT_EQ(write_image(parsed.layout, {}, prompt_tokens, blocks_of(parsed, image_, prompt_tokens)),
            image_);
}

TEST_P(StateImageTest, APrefixImageIsWhatLlamaHoldsAfterCuttingTheWholeOneBack) {
  StateImage parsed;
  std::string why;
  ASSERT_TRUE(parse_state_image(image_, ImageKind::sequence, &parsed, &why)) << why;
  const auto blocks = blocks_of(parsed, image_, prompt_tokens);
  for (uint32_t n : {block_tokens, 3 * block_tokens, 1u}) {
    SCOPED_TRACE(n);
    // Blocks of a prefix are the first blocks; a 1-token prefix is the first block's
    // first cell, written as a run of its own.
    std::vector<Bytes> prefix_blocks(blocks.begin(),
                                     blocks.begin() + (n + block_tokens - 1) / block_tokens);
    if (n % block_tokens != 0) {
      prefix_blocks.back().resize(parsed.layout.token_kv_bytes());
      gather_cells(parsed, image_.data(), 0, 1, prefix_blocks.back().data());
    }
    const Bytes prefix = write_image(parsed.layout, {}, n, prefix_blocks);

    Engine whole(model_, GetParam());
    ASSERT_TRUE(whole.load(image_));
    whole.keep_first(n);
    EXPECT_EQ(prefix, whole.image());

    Engine restored(model_, GetParam());
    ASSERT_TRUE(restored.load(prefix));
    EXPECT_EQ(restored.last_position(), llama_pos(n - 1));
    EXPECT_EQ(restored.image(), prefix);
  }
}

TEST_P(StateImageTest, SlotFilesKeepTheirTokenWordsAndLoadAsPrefixes) {
  const auto tokens = prompt(prompt_tokens);
  for (bool packed : {false, true}) {
    SCOPED_TRACE(packed ? "packed" : "plain");
    const Bytes file = slot_file(packed);
    StateImage parsed;
    std::string why;
    ASSERT_TRUE(parse_state_image(file, ImageKind::slot_file, &parsed, &why)) << why;
    EXPECT_EQ(parsed.layout.packed_tokens, packed);
    EXPECT_EQ(parsed.tokens, tokens);
    const auto blocks = blocks_of(parsed, file, prompt_tokens);
    EXPECT_EQ(write_image(parsed.layout, parsed.tokens, prompt_tokens, blocks), file);

    const uint32_t n = 2 * block_tokens;
    const Bytes prefix = write_image(parsed.layout, parsed.tokens, n,
                                     std::vector<Bytes>(blocks.begin(), blocks.begin() + 2));
    const std::string path = "/tmp/kvpark-state-image." + std::to_string(getpid()) + ".prefix";
    write_file(path, prefix);
    Engine restored(model_, GetParam());
    std::vector<llama_token> words(n + 8);
    size_t word_count = 0;
    EXPECT_EQ(llama_state_seq_load_file(restored.ctx(), path.c_str(), restored.seq(), words.data(),
                                        words.size(), &word_count),
              prefix.size());
    std::remove(path.c_str());
    words.resize(word_count);
    const std::vector<llama_token> expected_tokens(tokens.begin(), tokens.begin() + n);
    if (packed) {
      ASSERT_EQ(words.size(), n + 4);
      EXPECT_EQ(std::vector<llama_token>(words.begin() + 3, words.end() - 1), expected_tokens);
    } else {
      EXPECT_EQ(words, expected_tokens);
    }
    EXPECT_EQ(restored.last_position(), llama_pos(n - 1));
  }
}

TEST_P(StateImageTest, TruncatedImagesAreRefused) {
  StateImage parsed;
  std::string why;
  for (size_t n = 0; n < image_.size(); n += n < 4096 ? 1 : 4093) {
    ASSERT_FALSE(parse_state_image(std::span(image_.data(), n), ImageKind::sequence, &parsed, &why))
        << n;
    EXPECT_FALSE(why.empty());
  }
  EXPECT_FALSE(parse_state_image(std::span(image_.data(), image_.size() - 1), ImageKind::sequence,
                                 &parsed, &why));
}

// kvpark-proxy's self-check (proxy/state_blocks.h) on the slot files an upstream saves
// of one slot at 2 and then 1 tokens: it learns the layout and hands back the 1-token
// file written from the 2-token one, which is the upstream's own; any difference, or
// a file it cannot read, keeps slot files whole with the reason.
TEST_P(StateImageTest, TheProxysSelfCheckLearnsTheLayoutOrSaysWhyNot) {
  Engine engine(model_, GetParam());
  ASSERT_TRUE(engine.ready());
  const std::vector<llama_token> tokens = prompt(2);
  ASSERT_TRUE(engine.prefill(tokens));
  const std::string path = "/tmp/kvpark-state-image." + std::to_string(getpid()) + ".check";
  auto save = [&](size_t n) {
    EXPECT_GT(llama_state_seq_save_file(engine.ctx(), path.c_str(), engine.seq(), tokens.data(), n),
              0u);
    Bytes file = read_file(path);
    std::remove(path.c_str());
    return file;
  };
  const Bytes two = save(2);
  engine.keep_first(1);
  const Bytes one = save(1);
  const kvpark_hash128 base{.low = 1, .high = 2};
  std::shared_ptr<const proxy::BlockShape> shape;
  Bytes prefix;
  std::string why;
  ASSERT_TRUE(proxy::learn_block_shape(one, two, base, &shape, &prefix, &why)) << why;
  EXPECT_EQ(prefix, one);
  EXPECT_EQ(shape->block_bytes, proxy::state_block_tokens * shape->layout.token_kv_bytes());
  EXPECT_FALSE(shape->space.low == base.low && shape->space.high == base.high);
  EXPECT_EQ(shape->space.low, proxy::block_namespace(base, shape->layout, 64).low);

  Bytes altered = one;
  altered[altered.size() - 1] ^= 0x01;  // the last V byte of the one cell
  shape.reset();
  EXPECT_FALSE(proxy::learn_block_shape(altered, two, base, &shape, &prefix, &why));
  EXPECT_EQ(shape, nullptr);
  EXPECT_NE(why.find("differs"), std::string::npos) << why;
  EXPECT_FALSE(proxy::learn_block_shape(
      one, std::span<const uint8_t>(two.data(), two.size() - 1), base, &shape, &prefix, &why));
  EXPECT_EQ(why.rfind("slot files not split: ", 0), 0u) << why;
  EXPECT_FALSE(proxy::learn_block_shape(two, one, base, &shape, &prefix, &why));
  EXPECT_NE(why.find("do not agree"), std::string::npos) << why;
}

// The parker's check of its first image (state_blocks.h): a plain image splits; one
// cut short or with a cell of another sequence does not, with the reason.
TEST_P(StateImageTest, TheParkersSelfCheckSplitsASequenceImageOrSaysWhyNot) {
  StateImage parsed;
  std::string why;
  ASSERT_TRUE(check_split(image_, ImageKind::sequence, &parsed, &why)) << why;
  EXPECT_EQ(parsed.cells, prompt_tokens);
  EXPECT_FALSE(check_split(std::span<const uint8_t>(image_.data(), image_.size() - 1),
                           ImageKind::sequence, &parsed, &why));
  EXPECT_NE(why, "");
  const Bytes empty = [&] {
    engine_->keep_first(0);
    return engine_->image();
  }();
  EXPECT_FALSE(check_split(empty, ImageKind::sequence, &parsed, &why));
}

// What the parker restores into a sequence is the image written for that sequence
// (its stream, its id) from blocks another sequence parked: llama.cpp loads it there
// and gives it back byte for byte.
TEST_P(StateImageTest, BlocksOfOneSequenceRestoreIntoAnother) {
  if (GetParam().sequences < 2) GTEST_SKIP() << "one sequence";
  StateImage parsed;
  std::string why;
  ASSERT_TRUE(check_split(image_, ImageKind::sequence, &parsed, &why)) << why;
  StateImage placed = parsed;
  placed.layout.source_seq_id = 0;
  placed.layout.cell_seq_id = 0;
  placed.layout.stream_index = 0;
  const Bytes image = recompose(placed, image_, 130, state_block_tokens);
  ASSERT_EQ(llama_state_seq_set_data_ext(engine_->ctx(), image.data(), image.size(), 0, 0),
            image.size());
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(engine_->ctx()), 0), 129);
  Bytes back(llama_state_seq_get_size_ext(engine_->ctx(), 0, 0));
  back.resize(llama_state_seq_get_data_ext(engine_->ctx(), back.data(), back.size(), 0, 0));
  EXPECT_EQ(back, image);
}

INSTANTIATE_TEST_SUITE_P(Caches, StateImageTest, ::testing::ValuesIn(caches),
                         [](const auto& test) { return std::string(test.param.name); });

// Offsets in a one-stream sequence image: magic, seq id, stream count, cell count, cells.
constexpr size_t stream_count_at = 8;
constexpr size_t cell_count_at = 12;
constexpr size_t first_cell_at = 16;
constexpr size_t cell_bytes = 12;

class AlteredImageTest : public StateImageTest {};

Bytes altered(Bytes image, size_t at, uint32_t value) {
  std::memcpy(image.data() + at, &value, sizeof value);
  return image;
}

TEST_P(AlteredImageTest, AlteredImagesAreRefusedWithTheReason) {
  const size_t layers_at = first_cell_at + prompt_tokens * cell_bytes;  // v_trans, layer count
  const struct {
    Bytes image;
    const char* reason;
  } cases[] = {
      {altered(image_, 0, 0x12345678), "magic"},
      {altered(image_, stream_count_at, 0), "stream count 0"},
      {altered(image_, stream_count_at, 1u << 30), "stream count"},
      {altered(image_, cell_count_at, prompt_tokens + 1), ""},
      {altered(image_, cell_count_at, 0xffffffff), "truncated"},
      {altered(image_, first_cell_at + 4, 2), "more than one sequence"},
      {altered(image_, first_cell_at + cell_bytes, 5), "position order"},
      {altered(image_, first_cell_at + cell_bytes + 8, 7), "two sequences"},
      {altered(image_, layers_at, 2), "v_trans 2"},
      {altered(image_, layers_at + 4, 0), "layer count 0"},
      {altered(image_, layers_at + 4, 100000), "layer count"},
      {altered(altered(image_, layers_at + 12, 0xffffffff), layers_at + 16, 0xffffffff), "K"},
  };
  for (const auto& c : cases) {
    StateImage parsed;
    std::string why;
    EXPECT_FALSE(parse_state_image(c.image, ImageKind::sequence, &parsed, &why)) << c.reason;
    EXPECT_NE(why.find(c.reason), std::string::npos) << why;
  }
  Bytes longer = image_;
  longer.push_back(0);
  StateImage parsed;
  std::string why;
  EXPECT_FALSE(parse_state_image(longer, ImageKind::sequence, &parsed, &why));
  EXPECT_NE(why.find("a section follows"), std::string::npos) << why;
  EXPECT_FALSE(parse_state_image(image_, ImageKind::slot_file, &parsed, &why));
  EXPECT_NE(why.find("not a slot file"), std::string::npos) << why;
}

INSTANTIATE_TEST_SUITE_P(Caches, AlteredImageTest, ::testing::Values(caches[0], caches[1]),
                         [](const auto& test) { return std::string(test.param.name); });

// Families whose state is more than per-token attention KV are refused, so they park
// whole; a mixture of experts has plain attention state and splits.
TEST(StateImageFamilies, OnlyPlainAttentionStateSplits) {
  for (TestModelArch arch : test_model_arches) {
    SCOPED_TRACE(test_model_arch_name(arch));
    llama_model* model =
        llama_model_load_from_file(model_file(arch).c_str(), llama_model_default_params());
    ASSERT_NE(model, nullptr);
    {
      Engine engine(model, caches[0]);
      ASSERT_TRUE(engine.ready());
      ASSERT_TRUE(engine.prefill(prompt(prompt_tokens)));
      const Bytes image = engine.image();
      StateImage parsed;
      std::string why;
      const bool splits = parse_state_image(image, ImageKind::sequence, &parsed, &why);
      if (arch == TestModelArch::llama || arch == TestModelArch::qwen3moe) {
        EXPECT_TRUE(splits) << why;
      } else {
        EXPECT_FALSE(splits);
        EXPECT_NE(why.find("a section follows"), std::string::npos) << why;
      }
    }
    llama_model_free(model);
  }
}

}  // namespace
}  // namespace kvpark::llama
