// Section 3: cost of kvpark_chain_hashes over the 16k-token prompt, per token.
//
// Each batch hashes the whole prompt `repetitions` times; the figure is the median
// batch divided by the tokens hashed, so a preempted batch on a noisy machine does
// not move it.
#include "client/kvpark.h"

#include "bench/bench.h"

namespace kvpark::bench {

std::vector<HashResult> run_hash_bench(int repetitions) {
  constexpr int batches = 7;
  const std::vector<int32_t> tokens = make_tokens(3, prompt_tokens);
  std::vector<HashResult> results;
  for (uint32_t chunk : {64u, 256u}) {
    const size_t chunks = prompt_tokens / chunk;
    std::vector<kvpark_hash128> hashes(chunks);
    const kvpark_hash128 seed{0x1234, 0x5678};
    uint64_t sink = 0;
    kvpark_chain_hashes(seed, tokens.data(), chunk, chunks, hashes.data());  // warm caches
    std::vector<double> per_token;
    for (int b = 0; b < batches; ++b) {
      const uint64_t t0 = now_nsec();
      for (int r = 0; r < repetitions; ++r) {
        kvpark_chain_hashes(seed, tokens.data(), chunk, chunks, hashes.data());
        sink += hashes.back().low;
      }
      const uint64_t t1 = now_nsec();
      per_token.push_back(double(t1 - t0) / (double(repetitions) * double(prompt_tokens)));
    }
    asm volatile("" : : "r"(sink));
    results.push_back({.chunk_tokens = chunk, .nsec_per_token = median(per_token)});
  }
  return results;
}

}  // namespace kvpark::bench
