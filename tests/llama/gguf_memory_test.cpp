// What a model's memory keeps, read from GGUF metadata alone (gguf_memory.h): each
// test model family, and files that are not what they claim. No llama.cpp needed.
#include "integrations/llama/gguf_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "integrations/llama/gguf_writer.h"

namespace kvpark::llama {
namespace {

class GgufMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpark-gguf-memory.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string write(const TestModelOptions& options) {
    const std::string path = dir_ + "/" + test_model_arch_name(options.arch) + ".gguf";
    EXPECT_EQ(write_test_model(path, options), GgufStatus::ok);
    return path;
  }
  MemoryShape shape_of(const std::string& path) {
    MemoryShape shape = MemoryShape::kv_cache;
    EXPECT_EQ(read_memory_shape(path, &shape), GgufReadStatus::ok) << path;
    return shape;
  }
  std::string dir_;
};

TEST_F(GgufMemory, EachTestModelFamilyReadsAsItsMemory) {
  EXPECT_EQ(shape_of(write({.arch = TestModelArch::llama})), MemoryShape::kv_cache);
  EXPECT_EQ(shape_of(write({.arch = TestModelArch::qwen3moe})), MemoryShape::kv_cache);
  EXPECT_EQ(shape_of(write({.arch = TestModelArch::gemma3})), MemoryShape::sliding_window);
  EXPECT_EQ(shape_of(write({.arch = TestModelArch::lfm2})), MemoryShape::recurrent);
}

TEST_F(GgufMemory, MissingFileIsNotFound) {
  MemoryShape shape = MemoryShape::recurrent;
  EXPECT_EQ(read_memory_shape(dir_ + "/absent.gguf", &shape), GgufReadStatus::not_found);
  EXPECT_EQ(shape, MemoryShape::recurrent);  // untouched on failure
}

// Cut anywhere in its metadata, or with another magic, a file is malformed: never a
// guess, never a read past its end.
TEST_F(GgufMemory, TruncatedOrForeignFileIsMalformed) {
  const std::string path = write({.arch = TestModelArch::gemma3});
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  const std::string cut = dir_ + "/cut.gguf";
  for (size_t length : {size_t(0), size_t(3), size_t(23), size_t(100), size_t(1000)}) {
    std::ofstream(cut, std::ios::binary | std::ios::trunc).write(bytes.data(), long(length));
    MemoryShape shape = MemoryShape::recurrent;
    EXPECT_EQ(read_memory_shape(cut, &shape), GgufReadStatus::malformed) << length << " bytes";
    EXPECT_EQ(shape, MemoryShape::recurrent);
  }
  std::vector<char> foreign = bytes;
  foreign[0] = 'X';
  std::ofstream(cut, std::ios::binary | std::ios::trunc)
      .write(foreign.data(), long(foreign.size()));
  MemoryShape shape = MemoryShape::recurrent;
  EXPECT_EQ(read_memory_shape(cut, &shape), GgufReadStatus::malformed);
}

}  // namespace
}  // namespace kvpark::llama
