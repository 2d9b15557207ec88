// Timing and sample helpers shared by the bench sections (see bench.h).
#include <time.h>

#include <algorithm>
#include <cassert>

#include "bench/bench.h"

namespace kvpark::bench {

uint64_t now_nsec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

Percentiles percentiles(std::vector<uint32_t>& samples_nsec) {
  Percentiles p;
  if (samples_nsec.empty()) return p;
  std::sort(samples_nsec.begin(), samples_nsec.end());
  const size_t n = samples_nsec.size();
  auto rank = [&](double q) {  // nearest rank: the smallest sample with >= q of them at or below
    size_t k = static_cast<size_t>(q * double(n) + 0.999999);
    return samples_nsec[std::clamp<size_t>(k, 1, n) - 1] / 1000.0;
  };
  p.p50_usec = rank(0.50);
  p.p99_usec = rank(0.99);
  p.max_usec = samples_nsec.back() / 1000.0;
  p.samples = n;
  return p;
}

double median(std::vector<double> values) {
  assert(!values.empty());
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::vector<int32_t> make_tokens(uint64_t seed, size_t count) {
  std::vector<int32_t> tokens(count);
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  for (int32_t& t : tokens) {  // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    t = static_cast<int32_t>((z ^ (z >> 31)) & 0x1ffff);
  }
  return tokens;
}

}  // namespace kvpark::bench
