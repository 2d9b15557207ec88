// Namespace fingerprint and weights digest cache: no daemon, no model (the
// snapshot header: tests/unit/sealed_payload_test.cpp).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "integrations/llama/kvpark_llama.h"

namespace kvpark::llama {
namespace {

bool operator==(kvpark_hash128 a, kvpark_hash128 b) {
  return a.low == b.low && a.high == b.high;
}

constexpr kvpark_hash128 weights{.low = 1, .high = 2};

TEST(LlamaNamespace, ChangesWithEveryParameterThatChangesTheState) {
  const llama_context_params base = llama_context_default_params();
  const kvpark_hash128 id = namespace_id(weights, base);
  EXPECT_FALSE(namespace_id(kvpark_hash128{.low = 1, .high = 3}, base) == id);
  auto differs = [&](auto change) {
    llama_context_params p = base;
    change(p);
    return !(namespace_id(weights, p) == id);
  };
  EXPECT_TRUE(differs([](auto& p) { p.type_k = GGML_TYPE_Q8_0; }));
  EXPECT_TRUE(differs([](auto& p) { p.type_v = GGML_TYPE_Q8_0; }));
  EXPECT_TRUE(differs([](auto& p) { p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED; }));
  EXPECT_TRUE(differs([](auto& p) { p.n_seq_max = 4; }));
  EXPECT_TRUE(differs([](auto& p) { p.kv_unified = !p.kv_unified; }));
  EXPECT_TRUE(differs([](auto& p) { p.swa_full = !p.swa_full; }));
  EXPECT_TRUE(differs([](auto& p) { p.rope_freq_base = 500000.0f; }));
  EXPECT_TRUE(differs([](auto& p) { p.yarn_orig_ctx = 8192; }));
  EXPECT_TRUE(differs([](auto& p) { p.n_rs_seq = 2; }));
}

TEST(LlamaNamespace, ChangesWithTheRotationSwitchOfQuantizedCaches) {
  const llama_context_params base = llama_context_default_params();
  EXPECT_FALSE(namespace_id(weights, base, /*rotation_disabled=*/false) ==
               namespace_id(weights, base, /*rotation_disabled=*/true));
  // The default reads LLAMA_ATTN_ROT_DISABLE as llama.cpp does: a number, 0 is off.
  ASSERT_EQ(setenv("LLAMA_ATTN_ROT_DISABLE", "1", 1), 0);
  EXPECT_TRUE(attention_rotation_disabled());
  ASSERT_EQ(setenv("LLAMA_ATTN_ROT_DISABLE", "0", 1), 0);
  EXPECT_FALSE(attention_rotation_disabled());
  ASSERT_EQ(unsetenv("LLAMA_ATTN_ROT_DISABLE"), 0);
  EXPECT_FALSE(attention_rotation_disabled());
  EXPECT_TRUE(namespace_id(weights, base) == namespace_id(weights, base, false));
}

TEST(LlamaNamespace, IgnoresSchedulingParameters) {
  const llama_context_params base = llama_context_default_params();
  llama_context_params p = base;
  p.n_ctx = 12345;
  p.n_batch = 64;
  p.n_ubatch = 32;
  p.n_threads = p.n_threads_batch = 7;
  EXPECT_TRUE(namespace_id(weights, p) == namespace_id(weights, base));
}

class WeightsDigest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpark-llama-digest.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    model_ = dir_ + "/model.gguf";
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  void write_model(const char* text, time_t mtime) {
    FILE* f = std::fopen(model_.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(text, f);
    std::fclose(f);
    const timespec times[2] = {{mtime, 0}, {mtime, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, model_.c_str(), times, 0), 0);
  }
  std::string dir_, model_;
};

TEST_F(WeightsDigest, IsCachedByInodeSizeAndMtime) {
  write_model("weights one", 1'000'000);
  kvpark_hash128 first, again, uncached;
  ASSERT_EQ(digest_weights(model_, dir_ + "/cache", &first), Status::ok);
  // Same size and mtime, same inode: the cache answers without reading the file.
  write_model("weights two", 1'000'000);
  ASSERT_EQ(digest_weights(model_, dir_ + "/cache", &again), Status::ok);
  EXPECT_TRUE(again == first);
  ASSERT_EQ(digest_weights(model_, "", &uncached), Status::ok);
  EXPECT_FALSE(uncached == first);
  // A new mtime is a new entry.
  write_model("weights two", 2'000'000);
  ASSERT_EQ(digest_weights(model_, dir_ + "/cache", &again), Status::ok);
  EXPECT_TRUE(again == uncached);
}

TEST_F(WeightsDigest, MissingModelIsNotFound) {
  kvpark_hash128 digest{.low = 9, .high = 9};
  EXPECT_EQ(digest_weights(dir_ + "/absent.gguf", dir_, &digest), Status::not_found);
  EXPECT_EQ(digest.low, 9u);  // untouched on failure
}

}  // namespace
}  // namespace kvpark::llama
