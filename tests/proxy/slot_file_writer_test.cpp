// SlotFileWriter (proxy/slot_file_writer.h): a slot file filled part by part while a
// second thread writes it comes out byte for byte, over a longer file in place, and a
// write that fails is reported, never taken for a whole file.
#include "proxy/slot_file_writer.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kvpark::proxy {
namespace {

class SlotFileWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/kvpark-slot-file-writer-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  static std::vector<uint8_t> pattern(size_t bytes, uint32_t seed) {
    std::vector<uint8_t> v(bytes);
    for (size_t i = 0; i < bytes; ++i) v[i] = uint8_t((i * 2654435761u + seed) >> 13);
    return v;
  }
  static std::vector<uint8_t> read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // Hands `bytes` to the writer in parts of the sizes given, in turn; false as soon
  // as the writer refuses one.
  static bool fill(SlotFileWriter& w, const std::vector<uint8_t>& bytes,
                   const std::vector<size_t>& part_sizes) {
    size_t at = 0;
    for (size_t i = 0; at < bytes.size(); ++i) {
      size_t room = 0;
      uint8_t* dst = w.space(&room);
      EXPECT_GT(room, 0u);
      const size_t n = std::min({room, part_sizes[i % part_sizes.size()], bytes.size() - at});
      std::copy_n(bytes.data() + at, n, dst);
      at += n;
      if (!w.filled(n)) return false;
    }
    return true;
  }
  static ino_t inode(const std::string& path) {
    struct stat st;
    return stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
  }

  std::string dir_;
};

TEST_F(SlotFileWriterTest, PartsOfEverySizeComeOutInOrder) {
  const std::string path = dir_ + "/slot.restore";
  // Several staging buffers' worth, in parts that straddle their edges.
  const std::vector<uint8_t> bytes = pattern((7u << 20) + 4099, 1);
  SlotFileWriter w;
  ASSERT_TRUE(w.open(path)) << w.why();
  ASSERT_TRUE(fill(w, bytes, {1, 4096, 333'333, 1u << 20, 17}));
  ASSERT_TRUE(w.finish(bytes.size())) << w.why();
  EXPECT_EQ(read_file(path), bytes);
}

TEST_F(SlotFileWriterTest, ALongerFileIsWrittenOverInPlaceAndCut) {
  const std::string path = dir_ + "/slot.restore";
  {
    std::ofstream out(path, std::ios::binary);
    const std::vector<uint8_t> old = pattern(5u << 20, 2);
    out.write(reinterpret_cast<const char*>(old.data()), std::streamsize(old.size()));
  }
  const ino_t before = inode(path);
  const std::vector<uint8_t> bytes = pattern((1u << 20) + 5, 3);
  SlotFileWriter w;
  ASSERT_TRUE(w.open(path)) << w.why();
  ASSERT_TRUE(fill(w, bytes, {65536}));
  ASSERT_TRUE(w.finish(bytes.size())) << w.why();
  EXPECT_EQ(read_file(path), bytes);
  EXPECT_EQ(inode(path), before) << "written over in place, not replaced";
}

TEST_F(SlotFileWriterTest, NothingFilledLeavesAnEmptyFile) {
  const std::string path = dir_ + "/slot.restore";
  SlotFileWriter w;
  ASSERT_TRUE(w.open(path)) << w.why();
  ASSERT_TRUE(w.finish(0)) << w.why();
  EXPECT_TRUE(read_file(path).empty());
}

// /dev/full fails every write with ENOSPC, as a full tmpfs does.
TEST_F(SlotFileWriterTest, AFailedWriteIsReportedNotTakenForAFile) {
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full";
  SlotFileWriter w;
  ASSERT_TRUE(w.open("/dev/full")) << w.why();
  fill(w, pattern(4u << 20, 4), {100'000});  // may take parts before the failure lands
  EXPECT_FALSE(w.finish(4u << 20));
  EXPECT_NE(w.why().find("/dev/full"), std::string::npos) << w.why();
  EXPECT_NE(w.why().find(std::strerror(ENOSPC)), std::string::npos) << w.why();
}

TEST_F(SlotFileWriterTest, AFileThatCannotBeOpenedSaysWhy) {
  SlotFileWriter w;
  EXPECT_FALSE(w.open(dir_ + "/no-such-dir/slot.restore"));
  EXPECT_NE(w.why().find("no-such-dir"), std::string::npos) << w.why();
}

// Dropped without finish() (a caller unwinding): the thread is joined, and what was
// handed over is written in order.
TEST_F(SlotFileWriterTest, AWriterDroppedHalfwayWritesWhatItWasHanded) {
  const std::string path = dir_ + "/slot.restore";
  const std::vector<uint8_t> bytes = pattern((3u << 20) + 100, 5);
  {
    SlotFileWriter w;
    ASSERT_TRUE(w.open(path)) << w.why();
    ASSERT_TRUE(fill(w, bytes, {1u << 20}));
  }
  const std::vector<uint8_t> written = read_file(path);
  EXPECT_GE(written.size(), 3u << 20) << "the full buffers handed over are written";
  EXPECT_LT(written.size(), bytes.size()) << "the one being filled was never handed over";
  EXPECT_TRUE(std::equal(written.begin(), written.end(), bytes.begin()));
}

}  // namespace
}  // namespace kvpark::proxy
