// kvpark-proxy-bench --restore-path (restore_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvpark::bench {

struct RestorePathOptions {
  std::string llama_server, proxy, kvparkd, make_test_model;
  size_t head_tokens = 4096;
  int layers = 32;     // kvpark-make-test-model geometry: ~65 KB of state a token
  int embedding = 1024;
  int threads = 2;
  uint64_t arena_bytes = 2ull << 30;  // the head and a turn, parked
};

// Runs the case and prints its tables; false when a request or a process failed.
bool run_restore_path(const RestorePathOptions& options, const std::string& work_dir);

}  // namespace kvpark::bench
