// Section 4: the daemon's private memory per indexed block.
//
// A fresh kvparkd indexes `blocks` small blocks (64 tokens, 256-byte payload: one
// 4 KiB extent each), published as prompts of publish_prompt_blocks blocks. The
// figure is the growth of the daemon's RssAnon (private anonymous memory: index,
// slab, hash tables, allocator) divided by the blocks indexed. The arena is shared
// memory (RssShmem) and is not counted. The baseline is read after the namespace's
// first HELLO, so it holds the event loop's buffers but no entry.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "bench/bench.h"
#include "client/kvpark.h"

namespace kvpark::bench {
namespace {

constexpr size_t publish_prompt_blocks = 1000;  // <= reserve_blocks_max

// "RssAnon:" of /proc/<pid>/status in KiB (private anonymous memory; the arena is
// shared memory and counts as RssShmem instead); 0 when unreadable.
uint64_t read_rss_anon_kib(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtoull(line.c_str() + 8, nullptr, 10);
  }
  return 0;
}

}  // namespace

bool run_memory_bench(const MemoryConfig& config, MemoryResult& ret_result,
                      std::string& ret_error) {
  const kvpark_namespace ns = {.id = {0x3e3e3e3eull, 4},
                               .block_tokens = memory_block_tokens,
                               .block_payload_bytes = memory_block_payload_bytes,
                               .snapshot_required = 0,
                               .prefill_tokens_per_second = 0,
                               .client_name = "kvpark-bench-memory"};
  kvpark_client* client = nullptr;
  if (kvpark_status s = kvpark_connect(config.socket_path.c_str(), &ns, &client);
      s != KVPARK_OK) {
    ret_error = std::string("connect: ") + kvpark_status_string(s);
    return false;
  }
  kvpark_stats stats{};
  kvpark_get_stats(client, &stats);
  const uint64_t blocks_before = stats.blocks;
  const uint64_t before_kib = read_rss_anon_kib(config.daemon_pid);
  const kvpark_publish_options options{.session_id = 7,
                                       .entry_class = KVPARK_CLASS_PRIVATE,
                                       .evidence = KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  size_t published = 0;
  for (uint64_t prompt = 0; published < config.blocks; ++prompt) {
    const size_t blocks = std::min(publish_prompt_blocks, config.blocks - published);
    const std::vector<int32_t> tokens = make_tokens(50'000 + prompt, blocks * memory_block_tokens);
    kvpark_reservation* r = nullptr;
    kvpark_status s = kvpark_reserve_blocks(client, &options, tokens.data(), tokens.size(), 0,
                                            blocks, &r);
    if (s == KVPARK_OK) {
      for (size_t i = 0; i < kvpark_reservation_block_count(r); ++i) {
        if (void* p = kvpark_reservation_block(r, i); p != nullptr) {
          std::memset(p, int(i), memory_block_payload_bytes);
        }
      }
      s = kvpark_seal(r);
    }
    if (s != KVPARK_OK) {
      ret_error = std::string("publish: ") + kvpark_status_string(s);
      kvpark_disconnect(client);
      return false;
    }
    published += blocks;
  }
  kvpark_get_stats(client, &stats);
  const uint64_t after_kib = read_rss_anon_kib(config.daemon_pid);
  kvpark_disconnect(client);
  if (stats.blocks - blocks_before != config.blocks || stats.evictions != 0) {
    ret_error = "memory: the daemon indexed " + std::to_string(stats.blocks - blocks_before) +
                " blocks (evicted " + std::to_string(stats.evictions) + "), expected " +
                std::to_string(config.blocks);
    return false;
  }
  if (before_kib == 0 || after_kib == 0) {
    ret_error = "memory: cannot read RssAnon of the daemon";
    return false;
  }
  ret_result = {.blocks = config.blocks,
                .rss_anon_before_kib = before_kib,
                .rss_anon_after_kib = after_kib,
                .bytes_per_block = after_kib >= before_kib
                                       ? double(after_kib - before_kib) * 1024.0 /
                                             double(config.blocks)
                                       : 0.0};
  return true;
}

}  // namespace kvpark::bench
