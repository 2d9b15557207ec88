// The llama.cpp integration end to end: a real kvparkd, real llama.cpp, and the
// project's own random-weight test model. Engines are separate processes
// (kvpark-llama-engine); "logits" is an XXH3-64 of the last token's full logits, so
// equal lines mean bit-identical logits.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "integrations/llama/snapshot_format.h"
#include "integrations/llama/state_blocks.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

constexpr int engine_timeout_msec = 60'000;
constexpr size_t head_tokens = 1000;
constexpr size_t total_tokens = 1100;
constexpr size_t head_blocks_end = head_tokens / llama::state_block_tokens * llama::state_block_tokens;

class LlamaRestore : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::getenv("KVPARK_LLAMA_ENGINE") == nullptr) return;  // SetUp skips
    directory_ = new std::string("/tmp/kvpark-llama-test." + std::to_string(getpid()));
    mkdir(directory_->c_str(), 0755);
    for (int seed : {1, 2}) {
      std::string out;
      const int rc = run_process(
          {built_binary("KVPARK_MAKE_TEST_MODEL"), model(seed), "--seed", std::to_string(seed)},
          engine_timeout_msec, &out);
      ASSERT_EQ(rc, 0) << out;
    }
  }
  static void TearDownTestSuite() {
    if (directory_ == nullptr) return;
    std::system(("rm -rf " + *directory_).c_str());
    delete directory_;
  }
  static std::string model(int seed) {
    return *directory_ + "/model-" + std::to_string(seed) + ".gguf";
  }

  void SetUp() override {
    if (std::getenv("KVPARK_LLAMA_ENGINE") == nullptr) GTEST_SKIP() << "built without llama.cpp";
    ASSERT_TRUE(daemon_.start());
  }

  std::vector<std::string> engine(std::vector<std::string> args, int model_seed = 1) {
    std::vector<std::string> argv{built_binary("KVPARK_LLAMA_ENGINE"),
                                  "--model",
                                  model(model_seed),
                                  "--socket",
                                  daemon_.socket_path(),
                                  "--cache-dir",
                                  *directory_ + "/cache",
                                  "--head",
                                  std::to_string(head_tokens),
                                  "--total",
                                  std::to_string(total_tokens)};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }
  std::string run(std::vector<std::string> args, int model_seed = 1) {
    std::string out;
    EXPECT_EQ(run_process(engine(std::move(args), model_seed), engine_timeout_msec, &out), 0)
        << out;
    return out;
  }
  static std::string line(const std::string& out, const std::string& key) {
    const size_t at = out.find(key + " ");
    return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
  }
  // A publisher: prefills head + tail seed 1, parking where the write-candidate
  // planner says: the head (system frontier) and the whole prompt (last content).
  void publish_head(std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--tail-seed", "1", "--plan"};
    args.insert(args.end(), extra.begin(), extra.end());
    const std::string out = run(args);
    ASSERT_EQ(line(out, "restored"), "restored 0 0 ok") << out;
    ASSERT_NE(out.find("parked"), std::string::npos) << out;
  }
  // Flips one state byte (or shrinks the recorded size) of the snapshot parked at the
  // head (magic: a whole one, or the tail of the head's blocks), in the daemon's
  // shared-memory arena.
  void damage_snapshot(bool truncate, uint64_t magic = llama::snapshot_magic) {
    // The arena is the daemon's memfd: reach it the way another process of the same
    // user can, through /proc.
    int fd = -1;
    const std::string dir = "/proc/" + std::to_string(daemon_.pid()) + "/fd";
    const std::string want = "/memfd:" + daemon_.arena_name() + " (deleted)";
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      std::error_code ec;
      if (std::filesystem::read_symlink(e.path(), ec).string() == want) {
        fd = open(e.path().c_str(), O_RDWR);
        break;
      }
    }
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    auto* base = static_cast<uint8_t*>(
        mmap(nullptr, size_t(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    ASSERT_NE(base, MAP_FAILED);
    int found = 0;
    for (size_t at = 0; at + sizeof(SealedPayloadHeader) <= size_t(st.st_size); at += 8) {
      if (std::memcmp(base + at, &magic, sizeof magic) != 0) continue;
      auto* header = reinterpret_cast<SealedPayloadHeader*>(base + at);
      if (header->position_tokens != head_tokens) continue;  // the last-content one
      if (truncate)
        header->body_bytes -= 1024;
      else
        base[at + sizeof *header + header->body_bytes / 2] ^= 0x10;
      ++found;
    }
    munmap(base, size_t(st.st_size));
    ASSERT_EQ(found, 1);
  }

  static std::string* directory_;
  DaemonProcess daemon_;
};
std::string* LlamaRestore::directory_ = nullptr;

TEST_F(LlamaRestore, SiblingRestoresAnotherProcessesHeadBitIdentical) {
  publish_head();
  const std::string sibling = run({"--tail-seed", "2"});
  EXPECT_EQ(line(sibling, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << sibling;
  const std::string fresh = run({"--tail-seed", "2", "--no-kvpark"});
  EXPECT_EQ(line(sibling, "logits"), line(fresh, "logits"));
  EXPECT_NE(line(sibling, "logits"), "");
}

TEST_F(LlamaRestore, RestartedEngineRestoresAfterThePublisherWasKilled) {
  ChildProcess publisher =
      spawn_process(engine({"--session", "7", "--tail-seed", "1", "--park-at",
                            std::to_string(total_tokens), "--private", "--hold"}));
  ASSERT_TRUE(publisher.wait_for_line("ready", engine_timeout_msec));
  publisher.kill_hard();
  // The restarted engine continues the same conversation: same prompt, 60 more tokens.
  std::string out;
  auto argv = engine({"--session", "7", "--tail-seed", "1"});
  argv.push_back("--total");
  argv.push_back(std::to_string(total_tokens + 60));
  ASSERT_EQ(run_process(argv, engine_timeout_msec, &out), 0) << out;
  EXPECT_EQ(line(out, "restored"), "restored " + std::to_string(total_tokens) + " 2 ok") << out;
  argv.push_back("--no-kvpark");
  std::string fresh;
  ASSERT_EQ(run_process(argv, engine_timeout_msec, &fresh), 0) << fresh;
  EXPECT_EQ(line(out, "logits"), line(fresh, "logits"));
}

TEST_F(LlamaRestore, AnotherModelFileNeverRestores) {
  publish_head();
  const std::string other = run({"--tail-seed", "2"}, /*model_seed=*/2);
  EXPECT_EQ(line(other, "restored"), "restored 0 0 ok") << other;
}

TEST_F(LlamaRestore, AnotherKvCacheTypeNeverRestores) {
  publish_head();
  const std::string other = run({"--tail-seed", "2", "--type-k", "q8_0"});
  EXPECT_EQ(line(other, "restored"), "restored 0 0 ok") << other;
}

TEST_F(LlamaRestore, CorruptedStateIsRefusedAndPrefilled) {
  publish_head({"--park-whole"});
  damage_snapshot(/*truncate=*/false);
  const std::string out = run({"--tail-seed", "2", "--park-whole"});
  // libkvpark's payload checksum refuses it before llama.cpp or the parker sees it.
  EXPECT_EQ(line(out, "restored"), "restored 0 0 ok") << out;
  EXPECT_EQ(line(out, "logits"), line(run({"--tail-seed", "2", "--no-kvpark"}), "logits"));
}

TEST_F(LlamaRestore, TruncatedStateIsRefusedAndPrefilled) {
  publish_head({"--park-whole"});
  damage_snapshot(/*truncate=*/true);
  const std::string out = run({"--tail-seed", "2", "--park-whole"});
  EXPECT_EQ(line(out, "restored"), "restored 0 0 ok") << out;
  EXPECT_EQ(line(out, "logits"), line(run({"--tail-seed", "2", "--no-kvpark"}), "logits"));
}

// The head parked as blocks and a tail snapshot: a damaged tail is refused by its
// checksum and the head's whole blocks still restore, as an engine's own cached
// prefix of that length would.
TEST_F(LlamaRestore, DamagedTailLeavesTheHeadsBlocksToRestore) {
  for (bool truncate : {false, true}) {
    SCOPED_TRACE(truncate ? "truncated" : "flipped");
    daemon_.kill_hard();
    ASSERT_TRUE(daemon_.start());
    publish_head();
    damage_snapshot(truncate, llama::state_tail_magic);
    const std::string out = run({"--tail-seed", "2"});
    EXPECT_EQ(line(out, "restored"), "restored " + std::to_string(head_blocks_end) + " 1 ok")
        << out;
    const std::string continued =
        run({"--tail-seed", "2", "--no-kvpark", "--split", std::to_string(head_blocks_end)});
    EXPECT_EQ(line(out, "state"), line(continued, "state"));
    EXPECT_EQ(line(out, "logits"), line(continued, "logits"));
  }
}

// Three conversations over one head, each parking the head and its whole prompt:
// as blocks the head is parked once and each conversation adds its own tokens only;
// whole, each prompt's snapshot holds the head again. Both runs on one daemon kind,
// sizes from kvparkd's own STATS.
TEST_F(LlamaRestore, SiblingsParkTheHeadOnceAsBlocks) {
  auto park_three = [&](const std::vector<std::string>& mode, kvpark_stats* ret_stats) {
    for (const char* tail : {"1", "2", "3"}) {
      std::vector<std::string> args{"--tail-seed", tail, "--plan"};
      args.insert(args.end(), mode.begin(), mode.end());
      const std::string out = run(args);
      ASSERT_NE(out.find("parked"), std::string::npos) << out;
      if (tail[0] != '1') {
        EXPECT_EQ(line(out, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
            << out;
      }
    }
    StatsClient stats(daemon_.socket_path());
    ASSERT_TRUE(stats.ok());
    *ret_stats = stats.get();
    ASSERT_EQ(stats.last_status(), KVPARK_OK);
  };
  kvpark_stats blocks{}, whole{};
  park_three({}, &blocks);
  daemon_.kill_hard();
  ASSERT_TRUE(daemon_.start());
  park_three({"--park-whole"}, &whole);
  const size_t block_tokens = llama::state_block_tokens;
  // The head's 15 blocks once, then 2 blocks of each prompt's own; a tail snapshot at
  // the head and one at each prompt's end.
  EXPECT_EQ(blocks.blocks, head_tokens / block_tokens + 3 * (total_tokens / block_tokens -
                                                             head_tokens / block_tokens));
  EXPECT_EQ(blocks.snapshots, 4u);
  EXPECT_EQ(whole.blocks, 0u);
  EXPECT_EQ(whole.snapshots, 4u);
  // Tokens of state held: blocks 1,000 + 3 × 100 (as blocks and tails); whole
  // 1,000 + 3 × 1,100: 3.3 times as many. The test model's blocks are 16 KiB, so the
  // page rounding of 25 small extents is allowed for.
  const uint64_t blocks_used = blocks.arena_data_bytes - blocks.arena_free_bytes;
  const uint64_t whole_used = whole.arena_data_bytes - whole.arena_free_bytes;
  std::printf("arena bytes for 3 conversations: %llu as blocks, %llu whole\n",
              (unsigned long long)blocks_used, (unsigned long long)whole_used);
  EXPECT_LT(blocks_used * 2, whole_used) << blocks_used << " vs " << whole_used;
}

// Parked state (the head as blocks and a tail) that reached disk survives a daemon crash
// bit-exact; the same records with one byte flipped on disk are never handed to
// llama.cpp: the engine prefills.
TEST_F(LlamaRestore, DiskCopySurvivesDaemonCrashAndACorruptOneIsRefused) {
  const std::string disk = *directory_ + "/disk";
  std::filesystem::create_directories(disk);
  auto on = [&](const DaemonProcess& d, std::vector<std::string> args) {
    std::vector<std::string> argv = engine(std::move(args));
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--socket") argv[i + 1] = d.socket_path();
    }
    std::string out;
    EXPECT_EQ(run_process(argv, engine_timeout_msec, &out), 0) << out;
    return out;
  };
  auto records = [&] {
    std::vector<std::filesystem::path> found;
    for (const auto& e : std::filesystem::recursive_directory_iterator(disk)) {
      if (e.is_regular_file() && e.path().extension() == ".kvr") found.push_back(e.path());
    }
    return found;
  };
  daemon_.kill_hard();
  const DaemonConfig config{.extra_args = {"--disk-dir", disk}};
  std::string fresh;
  {
    DaemonProcess first(config);
    ASSERT_TRUE(first.start());
    const std::string published = on(first, {"--tail-seed", "1", "--plan"});
    ASSERT_NE(published.find("parked"), std::string::npos) << published;
    // The shared head is written through at seal; wait for its record.
    // The shared head (its 15 blocks and its tail) is written through at seal: wait
    // until kvparkd says all of it has a disk copy.
    StatsClient stats(first.socket_path());
    ASSERT_TRUE(stats.wait_until(
        [](const kvpark_stats& s) {
          return s.disk_entries >= head_tokens / llama::state_block_tokens + 1;
        },
        engine_timeout_msec));
    first.kill_hard();
  }
  {
    DaemonProcess second(config);
    ASSERT_TRUE(second.start());
    const std::string out = on(second, {"--tail-seed", "2"});
    EXPECT_EQ(line(out, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok") << out;
    fresh = on(second, {"--tail-seed", "2", "--no-kvpark"});
    EXPECT_EQ(line(out, "logits"), line(fresh, "logits"));
    second.kill_hard();
  }
  for (const auto& record : records()) {  // one flipped byte near the end of each record
    std::fstream f(record, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-200, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x01;
    f.seekp(-200, std::ios::end);
    f.write(&c, 1);
  }
  DaemonProcess third(config);
  ASSERT_TRUE(third.start());
  const std::string out = on(third, {"--tail-seed", "2"});
  EXPECT_EQ(line(out, "restored").rfind("restored 0 ", 0), 0u) << out;
  EXPECT_EQ(line(out, "logits"), line(fresh, "logits"));
}

}  // namespace
}  // namespace kvpark::testing
