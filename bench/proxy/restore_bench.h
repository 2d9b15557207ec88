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
  std::string park_as = "blocks";     // the proxy's --park-as
};

// Runs the case and prints its tables; false when a request or a process failed.
bool run_restore_path(const RestorePathOptions& options, const std::string& work_dir);

// kvpark-proxy-bench --capacity (capacity_bench.cpp): what kvparkd's arena holds after
// N sibling conversations of T turns over one head, parked as blocks and as whole
// slot files, against the bytes of their unique tokens; prints the table.
bool run_capacity(const RestorePathOptions& options, int conversations, int turns,
                  const std::string& work_dir);

}  // namespace kvpark::bench
