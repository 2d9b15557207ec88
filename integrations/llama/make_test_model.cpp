// kvpark-make-test-model: writes kvpark's tiny random-weight llama GGUF.
//   kvpark-make-test-model OUTPUT.gguf [--seed N] [--layers N] [--embedding N]
//                          [--text-only-output 1]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "integrations/llama/gguf_writer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s OUTPUT.gguf [--seed N] [--layers N] [--embedding N]"
                 " [--text-only-output 1]\n",
                 argv[0]);
    return 2;
  }
  kvpark::llama::TestModelOptions options;
  for (int i = 2; i + 1 < argc; i += 2) {
    const unsigned long long v = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--seed") == 0)
      options.seed = v;
    else if (std::strcmp(argv[i], "--layers") == 0)
      options.block_count = uint32_t(v);
    else if (std::strcmp(argv[i], "--embedding") == 0)
      options.embedding_length = uint32_t(v);
    else if (std::strcmp(argv[i], "--text-only-output") == 0)
      options.text_only_output = v != 0;
    else {
      std::fprintf(stderr, "%s: unknown option %s\n", argv[0], argv[i]);
      return 2;
    }
  }
  const auto status = kvpark::llama::write_test_model(argv[1], options);
  if (status != kvpark::llama::GgufStatus::ok) {
    std::fprintf(stderr, "%s: cannot write %s\n", argv[0], argv[1]);
    return 1;
  }
  return 0;
}
