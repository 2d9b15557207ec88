// kvpark-bench: the host-tier benchmark (issue 2). Each section runs against a
// real kvparkd started for it (tests/testing/daemon_process.h) and returns plain figures;
// main.cpp prints them as a table or JSON and judges them against the targets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::bench {

// Targets from issue 2, with their unit last.
inline constexpr double lookup_p50_usec_max = 50;
inline constexpr double lookup_p99_usec_max = 200;
inline constexpr double copy_ratio_min = 0.9;
inline constexpr double hash_nsec_per_token_max = 5;

inline constexpr size_t prompt_tokens = 16384;  // the 16k-token prompt of sections 1 and 3

struct Percentiles {
  double p50_usec = 0;
  double p99_usec = 0;
  double max_usec = 0;
  size_t samples = 0;
};

// Nearest-rank percentiles of samples in nanoseconds; sorts them.
Percentiles percentiles(std::vector<uint32_t>& samples_nsec);
double median(std::vector<double> values);
uint64_t now_nsec();  // CLOCK_MONOTONIC

// Deterministic pseudo-random token ids in [0, 2^17) (a plausible vocabulary).
std::vector<int32_t> make_tokens(uint64_t seed, size_t count);

// 1. LOOKUP round trip.
struct LookupConfig {
  std::string socket_path;
  std::vector<uint32_t> block_tokens;  // one namespace each
  std::vector<int> clients;            // concurrent client processes
  int iterations = 0;                  // measured per client and mode
  int warmup = 0;
};
struct LookupResult {
  uint32_t block_tokens = 0;
  int clients = 0;
  uint32_t restorable_tokens = 0;
  Percentiles full;    // kvpark_lookup + kvpark_plan_release: hashing, socket, confirmation
  Percentiles socket;  // the same two round trips with pre-hashed chunks, no confirmation
};
bool run_lookup_bench(const LookupConfig& config, std::vector<LookupResult>& ret_results,
                      std::string& ret_error);
// The kernel's floor for one round trip: a 64-byte SOCK_SEQPACKET ping-pong between
// two processes, no daemon. A lookup+release makes two such round trips.
Percentiles run_socket_floor(int iterations);

// 2. Restore and publish throughput against memcpy.
struct CopyConfig {
  std::string socket_path;
  uint64_t bytes = 0;
  int repetitions = 0;
};
struct CopyResult {
  std::string huge_pages;   // the daemon's --huge-pages
  std::string pages;        // what backed the arena: "4k", "thp", "hugetlb"
  uint64_t bytes = 0;
  int repetitions = 0;
  double memcpy_sec = 0;         // medians, seconds per pass
  double publish_first_sec = 0;  // fresh client mapping: every page faults once
  double publish_warm_sec = 0;   // same mapping, same extent again
  double restore_first_sec = 0;
  double restore_warm_sec = 0;
  bool warm_reused_extent = true;  // the warm publish landed on the pages of the first
  // The daemon's loop while a 1 GiB entry is published and sealed: STATS round trips
  // of another client, idle and during the publishes (microseconds).
  Percentiles loop_idle;
  Percentiles loop_during_publish;
};
bool run_copy_bench(const CopyConfig& config, CopyResult& ret_result, std::string& ret_error);

// 5. Attaching to a large arena: connect time and page-table growth of the client.
struct AttachResult {
  uint64_t arena_bytes = 0;
  double connect_msec = 0;        // median kvpark_connect (HELLO, both fds, both mappings)
  int64_t page_table_kib = 0;     // VmPTE growth of this process across the connect
};
bool run_attach_bench(const std::string& socket_path, uint64_t arena_bytes, int repetitions,
                      AttachResult& ret_result, std::string& ret_error);

// 3. Chain hashing cost.
struct HashResult {
  uint32_t chunk_tokens = 0;
  double nsec_per_token = 0;  // median over batches
};
std::vector<HashResult> run_hash_bench(int repetitions);

// 4. Daemon anonymous memory per indexed block.
struct MemoryConfig {
  std::string socket_path;
  int daemon_pid = 0;
  size_t blocks = 0;
};
struct MemoryResult {
  size_t blocks = 0;
  uint64_t rss_anon_before_kib = 0;
  uint64_t rss_anon_after_kib = 0;
  double bytes_per_block = 0;
};
bool run_memory_bench(const MemoryConfig& config, MemoryResult& ret_result,
                      std::string& ret_error);

// Geometry the memory section publishes with; main sizes that daemon's arena from it.
inline constexpr uint32_t memory_block_tokens = 64;
inline constexpr uint64_t memory_block_payload_bytes = 256;

}  // namespace kvpark::bench
