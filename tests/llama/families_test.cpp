// Every model family on every KV cache it allows, through the llama.cpp integration:
// a real kvparkd, real llama.cpp, and the project's test model of each family
// (kvpark-make-test-model --arch). Engines are separate processes
// (kvpark-llama-engine). Each case holds three claims:
//   - the sibling's restored state is byte-identical to the state an engine has after
//     prefilling the same head itself ("state P HEX" lines);
//   - its answer (an XXH3-64 of the last token's full logits) equals that of an engine
//     continuing from its own cached prefix of the same length (--split: llama.cpp's
//     own save and reload at the head, as its prompt cache restores one);
//   - a prompt that shares less than any parked position restores nothing: a hybrid's
//     recurrent state or an iSWA window is never restored where it was not taken.
// Models are 256 wide with 64-dimension heads: what a q8_0 cache needs, and where
// llama.cpp rotates quantized K/V rows (LLAMA_ATTN_ROT_DISABLE turns that off).
#include <ggml-backend.h>
#include <gtest/gtest.h>
#include <llama.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "integrations/llama/gguf_writer.h"
#include "tests/testing/daemon_process.h"

namespace kvpark::testing {
namespace {

using llama::TestModelArch;

constexpr int engine_timeout_msec = 120'000;
constexpr size_t head_tokens = 1000;
constexpr size_t total_tokens = 1100;

// A KV cache configuration an engine runs with.
struct KvCache {
  const char* name;  // test-name suffix
  std::vector<std::string> args;
};
const KvCache kv_caches[] = {
    {"f16", {"--type-k", "f16", "--type-v", "f16"}},
    {"f16_flash", {"--type-k", "f16", "--type-v", "f16", "--flash-attn"}},
    {"q8_0_flash", {"--type-k", "q8_0", "--type-v", "q8_0", "--flash-attn"}},
    {"q8_0_k", {"--type-k", "q8_0", "--type-v", "f16"}},  // quantized V needs flash attention
};

std::string& suite_directory() {
  static std::string directory;
  return directory;
}

std::string model_path(TestModelArch arch) {
  return suite_directory() + "/" + llama::test_model_arch_name(arch) + ".gguf";
}

std::string line(const std::string& out, const std::string& key) {
  const size_t at = out.find(key + " ");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

class LlamaFamilies : public ::testing::TestWithParam<std::tuple<TestModelArch, KvCache>> {
 protected:
  static void SetUpTestSuite() {
    if (std::getenv("KVPARK_LLAMA_ENGINE") == nullptr) return;  // SetUp skips
    suite_directory() = "/tmp/kvpark-llama-families." + std::to_string(getpid());
    mkdir(suite_directory().c_str(), 0755);
    for (TestModelArch arch : llama::test_model_arches) {
      std::string out;
      const int rc =
          run_process({built_binary("KVPARK_MAKE_TEST_MODEL"), model_path(arch), "--arch",
                       llama::test_model_arch_name(arch), "--embedding", "256"},
                      engine_timeout_msec, &out);
      ASSERT_EQ(rc, 0) << out;
    }
  }
  static void TearDownTestSuite() {
    if (suite_directory().empty()) return;
    std::system(("rm -rf " + suite_directory()).c_str());
  }

  void SetUp() override {
    if (std::getenv("KVPARK_LLAMA_ENGINE") == nullptr) GTEST_SKIP() << "built without llama.cpp";
    ASSERT_TRUE(daemon_.start());
  }

  TestModelArch arch() const { return std::get<0>(GetParam()); }
  // Whether the family's state is a plain KV cache, parked as blocks; an iSWA window or
  // a hybrid's recurrent state parks whole.
  bool parks_blocks() const {
    return arch() != TestModelArch::gemma3 && arch() != TestModelArch::lfm2;
  }
  std::string test_model_name() const { return llama::test_model_arch_name(arch()); }
  const KvCache& cache() const { return std::get<1>(GetParam()); }

  // An engine on this case's model and cache; `environment` ("NAME=value") goes first.
  std::string run(std::vector<std::string> args, std::vector<std::string> environment = {}) {
    std::vector<std::string> argv{"/usr/bin/env"};
    argv.insert(argv.end(), environment.begin(), environment.end());
    argv.insert(argv.end(),
                {built_binary("KVPARK_LLAMA_ENGINE"), "--model", model_path(arch()), "--socket",
                 daemon_.socket_path(), "--cache-dir", suite_directory() + "/cache", "--head",
                 std::to_string(head_tokens), "--total", std::to_string(total_tokens)});
    argv.insert(argv.end(), cache().args.begin(), cache().args.end());
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out;
    EXPECT_EQ(run_process(argv, engine_timeout_msec, &out), 0) << out;
    return out;
  }

  // Prefills head + tail seed 1, parking the head (system frontier) and the prompt.
  void publish_head(std::vector<std::string> environment = {}) {
    const std::string out = run({"--tail-seed", "1", "--plan"}, std::move(environment));
    ASSERT_EQ(line(out, "restored"), "restored 0 0 ok") << out;
    ASSERT_NE(out.find("parked"), std::string::npos) << out;
  }

  DaemonProcess daemon_;
};

TEST_P(LlamaFamilies, SiblingRestoresTheHeadExactlyAndAnswersAsACachedPrefixWould) {
  publish_head();
  const std::string sibling = run({"--tail-seed", "2"});
  ASSERT_EQ(line(sibling, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << sibling;
  if (parks_blocks()) {
    EXPECT_EQ(line(sibling, "parking"), "parking blocks") << sibling;
  } else {
    EXPECT_EQ(line(sibling, "parking").rfind("parking whole: ", 0), 0u) << sibling;
  }
  const std::string continued =
      run({"--tail-seed", "2", "--no-kvpark", "--split", std::to_string(head_tokens)});
  EXPECT_EQ(line(sibling, "state"), line(continued, "state"));
  EXPECT_NE(line(sibling, "state"), "");
  EXPECT_EQ(line(sibling, "logits"), line(continued, "logits"));
  EXPECT_NE(line(sibling, "logits"), "");
}

// The same head parked whole (--park-whole) restores the same state: blocks give
// byte for byte what a whole snapshot gives.
TEST_P(LlamaFamilies, BlocksRestoreWhatAWholeSnapshotRestores) {
  if (!parks_blocks()) GTEST_SKIP() << "this family parks whole snapshots only";
  publish_head();
  const std::string from_blocks = run({"--tail-seed", "2"});
  ASSERT_EQ(line(from_blocks, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << from_blocks;
  daemon_.kill_hard();
  ASSERT_TRUE(daemon_.start());
  const std::string published = run({"--tail-seed", "1", "--plan", "--park-whole"});
  ASSERT_EQ(line(published, "parking"), "parking whole: asked to park whole") << published;
  const std::string from_whole = run({"--tail-seed", "2", "--park-whole"});
  ASSERT_EQ(line(from_whole, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << from_whole;
  EXPECT_EQ(line(from_blocks, "state"), line(from_whole, "state"));
  EXPECT_NE(line(from_blocks, "state"), "");
  EXPECT_EQ(line(from_blocks, "logits"), line(from_whole, "logits"));
}

// Family traits, on one cache each: where a state may be restored, and the rotation.
class LlamaFamilyPositions : public LlamaFamilies {};
class LlamaFamilyRotation : public LlamaFamilies {};

// The publisher parks only its whole prompt (head + tail 1); a sibling sharing the
// head alone restores the head's whole blocks where the family parks blocks (960 of
// its 1,000 tokens, exactly as an engine's own cached prefix of 960), and nothing
// where it parks whole: a hybrid's recurrent state or an iSWA window is never
// restored where it was not taken.
TEST_P(LlamaFamilyPositions, PrefixShorterThanEveryParkedPositionRestoresItsBlocksOrNothing) {
  const std::string published =
      run({"--tail-seed", "1", "--park-at", std::to_string(total_tokens)});
  ASSERT_NE(published.find("parked"), std::string::npos) << published;
  const std::string sibling = run({"--tail-seed", "2"});
  if (parks_blocks()) {
    const size_t blocks_end = head_tokens / 64 * 64;
    ASSERT_EQ(line(sibling, "restored"), "restored " + std::to_string(blocks_end) + " 1 ok")
        << sibling;
    const std::string continued =
        run({"--tail-seed", "2", "--no-kvpark", "--split", std::to_string(blocks_end)});
    EXPECT_EQ(line(sibling, "state"), line(continued, "state"));
    EXPECT_EQ(line(sibling, "logits"), line(continued, "logits"));
  } else {
    EXPECT_EQ(line(sibling, "restored"), "restored 0 0 ok") << sibling;
  }
  const std::string fresh = run({"--tail-seed", "2", "--no-kvpark"});
  EXPECT_EQ(line(sibling, "logits"), line(fresh, "logits"));
}

// Three sessions share a 1,300-token prefix and mark nothing. The second one's lookup
// carries kvparkd's capture hint (recurrence detection) and parks there; the third
// restores it exactly: the one way a recurrent or iSWA model gets a snapshot where
// no candidate was planned.
TEST_P(LlamaFamilyPositions, RecurringPrefixIsCapturedWhereTheHintSaysAndRestored) {
  const std::vector<std::string> shape = {"--head", "1300", "--total", "1400"};
  auto session = [&](const char* id, const char* tail) {
    std::vector<std::string> args = shape;
    args.insert(args.end(), {"--session", id, "--tail-seed", tail});
    return run(args);
  };
  const std::string first = session("11", "1");
  EXPECT_EQ(line(first, "hint"), "") << first;
  const std::string second = session("12", "2");
  const std::string hint = line(second, "hint");
  ASSERT_NE(hint, "") << second;
  const uint32_t position = uint32_t(std::stoul(hint.substr(5)));
  EXPECT_GE(position, 1024u);
  EXPECT_LE(position, 1300u);
  EXPECT_NE(second.find("parked"), std::string::npos) << second;
  const std::string third = session("13", "3");
  ASSERT_EQ(line(third, "restored"), "restored " + std::to_string(position) + " 1 ok") << third;
  std::vector<std::string> reference = shape;
  reference.insert(reference.end(),
                   {"--tail-seed", "3", "--no-kvpark", "--split", std::to_string(position)});
  const std::string continued = run(reference);
  EXPECT_EQ(line(third, "state"), line(continued, "state"));
  EXPECT_EQ(line(third, "logits"), line(continued, "logits"));
}

// What the model file fixes about the state — the KV heads, the SWA window, the
// experts routed per token, the recurrent state's size — is in the weights digest: a model that
// differs only there is another namespace, and a head parked under one is never restored under the
// other.
TEST_P(LlamaFamilyPositions, ModelThatDiffersOnlyInItsStateShapeNeverRestores) {
  llama::TestModelOptions other{.arch = arch(), .embedding_length = 256};
  switch (arch()) {
    case TestModelArch::llama:
      other.head_count_kv = 4;  // wider K and V rows
      break;
    case TestModelArch::qwen3moe:
      other.expert_used_count = 1;  // same tensors, other routing
      break;
    case TestModelArch::gemma3:
      other.sliding_window = 96;  // same tensors, another window
      break;
    case TestModelArch::lfm2:
      other.shortconv_cache = 4;  // a larger recurrent state
      break;
  }
  const std::string other_model = suite_directory() + "/other-" + test_model_name() + ".gguf";
  ASSERT_EQ(llama::write_test_model(other_model, other), llama::GgufStatus::ok);
  publish_head();
  std::string out;
  std::vector<std::string> argv{built_binary("KVPARK_LLAMA_ENGINE"),
                                "--model",
                                other_model,
                                "--socket",
                                daemon_.socket_path(),
                                "--cache-dir",
                                suite_directory() + "/cache",
                                "--head",
                                std::to_string(head_tokens),
                                "--total",
                                std::to_string(total_tokens),
                                "--tail-seed",
                                "2"};
  argv.insert(argv.end(), cache().args.begin(), cache().args.end());
  ASSERT_EQ(run_process(argv, engine_timeout_msec, &out), 0) << out;
  EXPECT_EQ(line(out, "restored"), "restored 0 0 ok") << out;
}

// kvparkd killed and started again under a service manager's fd store: it adopts
// the arena, and a sibling restores the head parked before the crash, exactly.
TEST_P(LlamaFamilyPositions, HeadSurvivesAKvparkdCrashKeptInTheFdStore) {
  daemon_.kill_hard();
  daemon_.config().fd_store = true;
  ASSERT_TRUE(daemon_.start());
  publish_head();
  daemon_.kill_hard();
  ASSERT_TRUE(daemon_.start()) << daemon_.log_tail();
  const std::string sibling = run({"--tail-seed", "2"});
  ASSERT_EQ(line(sibling, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << sibling << daemon_.log_tail();
  const std::string continued =
      run({"--tail-seed", "2", "--no-kvpark", "--split", std::to_string(head_tokens)});
  EXPECT_EQ(line(sibling, "state"), line(continued, "state"));
  EXPECT_EQ(line(sibling, "logits"), line(continued, "logits"));
}

// Rotated and unrotated quantized rows differ in meaning, not in size: a state parked
// under one setting is never restored under the other.
TEST_P(LlamaFamilyRotation, RotationSwitchOfQuantizedCachesIsAnotherNamespace) {
  publish_head({"LLAMA_ATTN_ROT_DISABLE=1"});
  const std::string rotated = run({"--tail-seed", "2"});
  EXPECT_EQ(line(rotated, "restored"), "restored 0 0 ok") << rotated;
  const std::string unrotated = run({"--tail-seed", "2"}, {"LLAMA_ATTN_ROT_DISABLE=1"});
  EXPECT_EQ(line(unrotated, "restored"), "restored " + std::to_string(head_tokens) + " 1 ok")
      << unrotated;
}

std::string case_name(const ::testing::TestParamInfo<LlamaFamilies::ParamType>& info) {
  return std::string(llama::test_model_arch_name(std::get<0>(info.param))) + "_" +
         std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, LlamaFamilies,
                         ::testing::Combine(::testing::ValuesIn(llama::test_model_arches),
                                            ::testing::ValuesIn(kv_caches)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(AllFamilies, LlamaFamilyPositions,
                         ::testing::Combine(::testing::ValuesIn(llama::test_model_arches),
                                            ::testing::Values(kv_caches[0])),
                         case_name);
INSTANTIATE_TEST_SUITE_P(AllFamilies, LlamaFamilyRotation,
                         ::testing::Combine(::testing::ValuesIn(llama::test_model_arches),
                                            ::testing::Values(kv_caches[2])),
                         case_name);

// Each test model loads in the pinned llama.cpp as the family it claims to be.
TEST(LlamaTestModels, EachFamilyLoadsWithItsMemoryShape) {
  if (std::getenv("KVPARK_LLAMA_ENGINE") == nullptr) GTEST_SKIP() << "built without llama.cpp";
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level >= GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  const char* backends = std::getenv("KVPARK_LLAMA_BACKENDS");
  if (backends != nullptr && backends[0] != '\0') ggml_backend_load_all_from_path(backends);
  llama_backend_init();
  const std::string dir = "/tmp/kvpark-llama-models." + std::to_string(getpid());
  mkdir(dir.c_str(), 0755);
  for (TestModelArch arch : llama::test_model_arches) {
    SCOPED_TRACE(llama::test_model_arch_name(arch));
    const std::string path = dir + "/" + llama::test_model_arch_name(arch) + ".gguf";
    ASSERT_EQ(llama::write_test_model(path, {.arch = arch, .sliding_window = 96}),
              llama::GgufStatus::ok);
    llama_model_params params = llama_model_default_params();
    params.progress_callback = [](float, void*) { return true; };
    llama_model* model = llama_model_load_from_file(path.c_str(), params);
    ASSERT_NE(model, nullptr);
    char arch_name[32] = "";
    llama_model_meta_val_str(model, "general.architecture", arch_name, sizeof arch_name);
    EXPECT_STREQ(arch_name, llama::test_model_arch_name(arch));
    EXPECT_EQ(llama_model_is_hybrid(model), arch == TestModelArch::lfm2);
    EXPECT_EQ(llama_model_n_swa(model), arch == TestModelArch::gemma3 ? 96 : 0);
    char experts[16] = "";
    const bool moe =
        llama_model_meta_val_str(model, "qwen3moe.expert_count", experts, sizeof experts) > 0;
    EXPECT_EQ(moe, arch == TestModelArch::qwen3moe);
    if (moe) {
      EXPECT_STREQ(experts, "4");
    }
    llama_model_free(model);
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace kvpark::testing
