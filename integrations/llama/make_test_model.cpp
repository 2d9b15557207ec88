// kvpark-make-test-model: writes kvpark's tiny random-weight GGUF of one model family.
//   kvpark-make-test-model OUTPUT.gguf [--arch ARCH] [--seed N] [--layers N]
//                          [--embedding N] [--sliding-window N] [--text-only-output 1]
// --help and --version are answered before anything is written; any other
// argument starting with '-' where OUTPUT belongs is refused, never a file name.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "integrations/llama/gguf_writer.h"
#include "proto/version.h"

namespace {

constexpr const char* program = "kvpark-make-test-model";

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: %s OUTPUT.gguf [--arch ARCH] [--seed N] [--layers N] [--embedding N]"
               " [--sliding-window N] [--text-only-output 1]\n"
               "Writes kvpark's tiny random-weight model (GGUF) of one family to OUTPUT.gguf.\n\n"
               "  --arch ARCH            llama (default; plain attention), qwen3moe (mixture\n"
               "                         of experts), gemma3 (sliding-window attention, iSWA),\n"
               "                         lfm2 (hybrid: short-convolution recurrent layers\n"
               "                         and attention)\n"
               "  --seed N               weights seed (default 1)\n"
               "  --sliding-window N     gemma3: tokens a sliding layer sees (default 128;\n"
               "                         Gemma 3 itself: 512 or 1024)\n"
               "  --layers N             transformer blocks\n"
               "  --embedding N          embedding length\n"
               "  --text-only-output 1   every vocabulary entry decodes to plain text\n"
               "  -h, --help             this help\n"
               "      --version          the version\n",
               program);
}

// A decimal number, whole: "12" yes, "12x", "", "-1" no.
bool parse_number(const char* text, unsigned long long& ret_value) {
  char* end = nullptr;
  if (text[0] < '0' || text[0] > '9') return false;
  ret_value = std::strtoull(text, &end, 10);
  return *end == '\0';
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", program, kvpark::version);
      return 0;
    }
  }
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (argv[1][0] == '-') {
    std::fprintf(stderr, "%s: unknown option %s (the output file comes first; see --help)\n",
                 program, argv[1]);
    return 2;
  }
  kvpark::llama::TestModelOptions options;
  for (int i = 2; i < argc; i += 2) {
    const char* flag = argv[i];
    if (std::strcmp(flag, "--arch") == 0) {
      if (i + 1 >= argc || !kvpark::llama::parse_test_model_arch(argv[i + 1], &options.arch)) {
        std::fprintf(stderr, "%s: --arch: one of llama, qwen3moe, gemma3, lfm2\n", program);
        return 2;
      }
      continue;
    }
    const bool known = std::strcmp(flag, "--seed") == 0 || std::strcmp(flag, "--layers") == 0 ||
                       std::strcmp(flag, "--sliding-window") == 0 ||
                       std::strcmp(flag, "--embedding") == 0 ||
                       std::strcmp(flag, "--text-only-output") == 0;
    if (!known) {
      std::fprintf(stderr, "%s: unknown option %s (see --help)\n", program, flag);
      return 2;
    }
    unsigned long long v = 0;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n", program, flag);
      return 2;
    }
    if (!parse_number(argv[i + 1], v)) {
      std::fprintf(stderr, "%s: %s: not a number: %s\n", program, flag, argv[i + 1]);
      return 2;
    }
    if (std::strcmp(flag, "--seed") == 0)
      options.seed = v;
    else if (std::strcmp(flag, "--layers") == 0)
      options.block_count = uint32_t(v);
    else if (std::strcmp(flag, "--embedding") == 0)
      options.embedding_length = uint32_t(v);
    else if (std::strcmp(flag, "--sliding-window") == 0)
      options.sliding_window = uint32_t(v);
    else
      options.text_only_output = v != 0;
  }
  const auto status = kvpark::llama::write_test_model(argv[1], options);
  if (status != kvpark::llama::GgufStatus::ok) {
    std::fprintf(stderr, "%s: cannot write %s%s\n", program, argv[1],
                 status == kvpark::llama::GgufStatus::invalid_argument
                     ? ": the geometry does not fit the family (see --help)"
                     : "");
    return 1;
  }
  return 0;
}
