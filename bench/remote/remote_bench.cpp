// kvpark-remote-bench: the remote tier's figures against references measured in the
// same run, on the same redis-server (started here, on loopback):
//   1. restore throughput: entries read back through remote::RemoteStore (manifest,
//      chunks pipelined, every chunk and the payload checksummed, copied into a
//      buffer the way the daemon copies into the arena) vs a plain hiredis GET loop
//      of the same chunk keys, interleaved entry by entry (target >= 0.8x);
//   2. the existence check of a 16k-token chain (256 keys of 64-token blocks, one
//      pipelined batch of manifest GETs), hit and miss, p50 / p99.
// --cluster runs section 2 against a 3-master Redis Cluster as well. Exit 0 unless a
// section fails to run; a MISS is reported, not fatal (as the other benches do).
#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "proto/xxh3.h"
#include "remote/cluster_client.h"
#include "remote/record_layout.h"
#include "remote/remote_limits.h"
#include "remote/remote_store.h"
#include "tests/testing/redis_process.h"

namespace kvpark::remote {
namespace {

constexpr double restore_ratio_min = 0.8;
constexpr uint32_t chain_block_tokens = 64;
constexpr uint32_t chain_tokens = 16384;
constexpr uint32_t chain_keys = chain_tokens / chain_block_tokens;

double now_sec() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Entry {
  EntryKey key;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> payload;
};

Entry make_entry(uint64_t n, uint64_t payload_bytes) {
  Entry e;
  e.key = EntryKey{.ns = {0xbe7c, 0x4}, .key_hash = {n * 0x9e3779b97f4a7c15ull + 1, n}};
  e.tokens.resize(chain_block_tokens);
  for (size_t i = 0; i < e.tokens.size(); ++i) e.tokens[i] = static_cast<int32_t>(n + i);
  e.payload.resize(payload_bytes);
  std::mt19937_64 rng(n);
  for (size_t i = 0; i + 8 <= e.payload.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(e.payload.data() + i, &v, 8);
  }
  return e;
}

Status put(RemoteStore& store, const Entry& e) {
  ManifestHeader h = manifest_header_for(e.key);
  h.block_tokens = chain_block_tokens;
  h.payload_checksum = XXH3_64bits(e.payload.data(), e.payload.size());
  return store.put(e.key, h,
                   ImageView{.tokens = reinterpret_cast<const uint8_t*>(e.tokens.data()),
                             .tokens_bytes = e.tokens.size() * sizeof(int32_t),
                             .payload = e.payload.data(),
                             .payload_bytes = e.payload.size()});
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Section 1. Returns false when something failed (not when the target is missed).
bool restore_section(const std::string& address, int port, size_t entries, uint64_t payload_bytes,
                     int rounds) {
  ClientOptions o;
  if (parse_endpoints(address, o.seeds) != Status::Ok) return false;
  ClusterClient client(o);
  RemoteStore store(client, chunk_bytes_default);
  std::vector<Entry> set;
  for (size_t i = 0; i < entries; ++i) {
    set.push_back(make_entry(i, payload_bytes));
    if (put(store, set.back()) != Status::Ok) {
      fprintf(stderr, "kvpark-remote-bench: writing entry %zu failed\n", i);
      return false;
    }
  }
  const uint64_t image_bytes = chain_block_tokens * sizeof(int32_t) + payload_bytes;
  const uint64_t total_bytes = image_bytes * entries;
  std::vector<int32_t> tokens(chain_block_tokens);
  std::vector<uint8_t> payload(payload_bytes, 1);  // touched: no first-touch faults timed
  std::vector<std::string> chunk_keys;
  const uint32_t chunks = chunk_count_for(image_bytes, chunk_bytes_default);
  for (const Entry& e : set) {
    for (uint32_t c = 0; c < chunks; ++c) chunk_keys.push_back(chunk_key(e.key, c));
  }
  redisContext* raw = redisConnect("127.0.0.1", port);
  if (raw == nullptr || raw->err != 0) return false;
  // Interleaved entry by entry (kvpark, then the raw loop of the same chunks), so a
  // load spike on this shared machine hits both alike; medians over rounds.
  std::vector<double> restore_gbps, raw_gbps, ratios;
  for (int round = 0; round < rounds; ++round) {
    double kv_sec = 0;
    double raw_sec = 0;
    uint64_t raw_bytes = 0;
    // kvpark, as the daemon's worker does for a chain: one pipelined existence check of
    // every key, then each entry streamed in with its chunks verified.
    double t0 = now_sec();
    std::vector<EntryKey> keys;
    for (const Entry& e : set) keys.push_back(e.key);
    std::vector<ProbeResult> found;
    store.probe(keys, found);
    kv_sec += now_sec() - t0;
    for (size_t i = 0; i < set.size(); ++i) {
      if (found[i].status != Status::Ok) return false;
      const ImageTarget target{.tokens = reinterpret_cast<uint8_t*>(tokens.data()),
                               .tokens_bytes = tokens.size() * sizeof(int32_t),
                               .payload = payload.data(),
                               .payload_bytes = payload.size()};
      t0 = now_sec();
      if (store.get(set[i].key, found[i].manifest, target) != Status::Ok) return false;
      kv_sec += now_sec() - t0;
      // Reference: a plain GET loop of the same chunk keys, reply bytes untouched.
      t0 = now_sec();
      for (uint32_t c = 0; c < chunks; ++c) {
        const std::string& k = chunk_keys[i * chunks + c];
        auto* r = static_cast<redisReply*>(redisCommand(raw, "GET %b", k.data(), k.size()));
        if (r == nullptr) return false;
        raw_bytes += r->len;
        freeReplyObject(r);
      }
      raw_sec += now_sec() - t0;
    }
    restore_gbps.push_back(static_cast<double>(total_bytes) / kv_sec / 1e9);
    raw_gbps.push_back(static_cast<double>(raw_bytes) / raw_sec / 1e9);
    ratios.push_back(restore_gbps.back() / raw_gbps.back());
  }
  redisFree(raw);
  const double kv = percentile(restore_gbps, 0.5);
  const double reference = percentile(raw_gbps, 0.5);
  const double ratio = percentile(ratios, 0.5);
  printf("restore: %zu entries of %.1f MiB (%u chunks of <= %u KiB), %d rounds, medians\n", entries,
         static_cast<double>(image_bytes) / (1 << 20), chunks, chunk_bytes_default >> 10, rounds);
  printf("  kvpark restore (chain probe + verified gets)  %6.2f GB/s\n", kv);
  printf("  raw GET loop of the same chunk keys           %6.2f GB/s\n", reference);
  printf("  ratio (median of rounds)                      %6.2fx (target >= %.1fx): %s\n", ratio,
         restore_ratio_min, ratio >= restore_ratio_min ? "PASS" : "MISS");
  return true;
}

// Section 3: a chain of small blocks (a 16k-token head of 64-token blocks), restored
// one get at a time and in pipelined batches (RemoteStore::get_batch, as the worker
// restores small entries), next to raw hiredis: a GET loop and one pipelined batch of
// the same chunk keys, all interleaved round by round.
bool small_section(const std::string& address, int port, uint64_t payload_bytes, int rounds) {
  ClientOptions o;
  if (parse_endpoints(address, o.seeds) != Status::Ok) return false;
  ClusterClient client(o);
  RemoteStore store(client, chunk_bytes_default);
  std::vector<Entry> set;
  std::vector<EntryKey> keys;
  for (uint32_t i = 0; i < chain_keys; ++i) {
    set.push_back(make_entry(200'000 + i, payload_bytes));
    if (put(store, set.back()) != Status::Ok) return false;
    keys.push_back(set.back().key);
  }
  std::vector<ProbeResult> found;
  store.probe(keys, found);
  for (const ProbeResult& r : found) {
    if (r.status != Status::Ok || !batchable(r.manifest)) return false;
  }
  const uint64_t image_bytes = chain_block_tokens * sizeof(int32_t) + payload_bytes;
  std::vector<std::vector<int32_t>> tokens(set.size(), std::vector<int32_t>(chain_block_tokens));
  std::vector<std::vector<uint8_t>> payloads(set.size(), std::vector<uint8_t>(payload_bytes, 1));
  std::vector<GetRequest> requests;
  for (size_t i = 0; i < set.size(); ++i) {
    requests.push_back({.key = keys[i],
                        .manifest = &found[i].manifest,
                        .target = {.tokens = reinterpret_cast<uint8_t*>(tokens[i].data()),
                                   .tokens_bytes = chain_block_tokens * sizeof(int32_t),
                                   .payload = payloads[i].data(),
                                   .payload_bytes = payload_bytes}});
  }
  std::vector<std::string> chunk_keys;
  for (const EntryKey& k : keys) chunk_keys.push_back(chunk_key(k, 0));
  redisContext* raw = redisConnect("127.0.0.1", port);
  if (raw == nullptr || raw->err != 0) return false;
  std::vector<double> one_ms, batch_ms, raw_loop_ms, raw_pipe_ms, raw_all_ms;
  std::vector<Status> statuses;
  for (int round = 0; round < rounds; ++round) {
    double t0 = now_sec();
    for (const GetRequest& g : requests) {
      if (store.get(g.key, *g.manifest, g.target) != Status::Ok) return false;
    }
    one_ms.push_back((now_sec() - t0) * 1e3);
    t0 = now_sec();
    uint64_t bytes = 0;
    size_t first = 0;
    for (size_t i = 0; i <= requests.size(); ++i) {
      const bool full = i == requests.size() || i - first >= batched_gets_max ||
                        bytes + image_bytes > batched_get_bytes_max;
      if (full && i > first) {
        store.get_batch({requests.data() + first, i - first}, statuses);
        for (Status st : statuses) {
          if (st != Status::Ok) return false;
        }
        first = i;
        bytes = 0;
      }
      bytes += image_bytes;
    }
    batch_ms.push_back((now_sec() - t0) * 1e3);
    t0 = now_sec();
    for (const std::string& k : chunk_keys) {
      auto* r = static_cast<redisReply*>(redisCommand(raw, "GET %b", k.data(), k.size()));
      if (r == nullptr) return false;
      freeReplyObject(r);
    }
    raw_loop_ms.push_back((now_sec() - t0) * 1e3);
    // The same keys pipelined in batches of the size kvpark's are, then all at once.
    const size_t per_batch = std::min<size_t>(batched_gets_max, batched_get_bytes_max / image_bytes);
    for (size_t batch : {per_batch, chunk_keys.size()}) {
      t0 = now_sec();
      for (size_t from = 0; from < chunk_keys.size(); from += batch) {
        const size_t last = std::min(chunk_keys.size(), from + batch);
        for (size_t i = from; i < last; ++i) {
          redisAppendCommand(raw, "GET %b", chunk_keys[i].data(), chunk_keys[i].size());
        }
        for (size_t i = from; i < last; ++i) {
          void* r = nullptr;
          if (redisGetReply(raw, &r) != REDIS_OK) return false;
          freeReplyObject(r);
        }
      }
      (batch == per_batch ? raw_pipe_ms : raw_all_ms).push_back((now_sec() - t0) * 1e3);
    }
  }
  redisFree(raw);
  printf("small entries: %u blocks of %.0f KiB (a %u-token chain), %d rounds, medians\n", chain_keys,
         static_cast<double>(image_bytes) / 1024, chain_tokens, rounds);
  printf("  kvpark, one get at a time                     %7.2f ms\n", percentile(one_ms, 0.5));
  printf("  kvpark, pipelined batches of <= %3llu KiB       %7.2f ms\n",
         static_cast<unsigned long long>(batched_get_bytes_max >> 10), percentile(batch_ms, 0.5));
  printf("  raw GET loop of the same chunk keys           %7.2f ms\n", percentile(raw_loop_ms, 0.5));
  printf("  raw GETs pipelined in batches of that size    %7.2f ms\n", percentile(raw_pipe_ms, 0.5));
  printf("  raw GETs pipelined all at once                %7.2f ms\n", percentile(raw_all_ms, 0.5));
  return true;
}

// Section 2: one pipelined batch of manifest GETs for a 16k-token chain.
bool probe_section(const std::string& seeds, const char* what, int iterations) {
  ClientOptions o;
  if (parse_endpoints(seeds, o.seeds) != Status::Ok) return false;
  ClusterClient client(o);
  RemoteStore store(client, chunk_bytes_default);
  std::vector<EntryKey> hit, miss;
  for (uint32_t i = 0; i < chain_keys; ++i) {
    const Entry e = make_entry(100'000 + i, 4096);
    if (put(store, e) != Status::Ok) return false;
    hit.push_back(e.key);
    EntryKey m = e.key;
    m.key_hash.high ^= 0x5a5a;
    miss.push_back(m);
  }
  for (const auto* keys : {&hit, &miss}) {
    std::vector<double> usec;
    std::vector<ProbeResult> found;
    for (int i = 0; i < iterations; ++i) {
      const double t0 = now_sec();
      store.probe(*keys, found);
      usec.push_back((now_sec() - t0) * 1e6);
      const Status want = keys == &hit ? Status::Ok : Status::NotFound;
      for (const ProbeResult& r : found) {
        if (r.status != want) return false;
      }
    }
    printf("existence check, %s, %u-token chain (%u keys) %s: p50 %.0f us, p99 %.0f us\n", what,
           chain_tokens, chain_keys, keys == &hit ? "all present" : "none present",
           percentile(usec, 0.5), percentile(usec, 0.99));
  }
  return true;
}

}  // namespace
}  // namespace kvpark::remote

int main(int argc, char** argv) {
  bool quick = false;
  bool cluster = false;
  uint64_t entry_chunks = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--cluster") {
      cluster = true;
    } else if (a == "--entry-chunks" && i + 1 < argc) {
      entry_chunks = std::max<uint64_t>(1, strtoull(argv[++i], nullptr, 0));
    } else {
      fprintf(stderr, "usage: kvpark-remote-bench [--quick] [--cluster] [--entry-chunks N]\n");
      return 2;
    }
  }
  if (kvpark::testing::redis_server_path().empty()) {
    fprintf(stderr, "kvpark-remote-bench: redis-server is not installed; skipped\n");
    return 77;
  }
  kvpark::testing::RedisProcess redis;
  if (!redis.start()) {
    fprintf(stderr, "kvpark-remote-bench: redis-server did not start: %s\n", redis.log_tail().c_str());
    return 1;
  }
  const std::string address = "redis://" + redis.address();
  bool ok = kvpark::remote::restore_section(address, redis.port(), quick ? 4 : std::max<uint64_t>(2, 32 / entry_chunks),
                                            entry_chunks * kvpark::remote::chunk_bytes_default -
                                                kvpark::remote::chain_block_tokens * sizeof(int32_t),
                                            quick ? 1 : 9);
  ok = kvpark::remote::probe_section(address, "one Redis", quick ? 20 : 200) && ok;
  ok = kvpark::remote::small_section(address, redis.port(), 16 * 1024, quick ? 1 : 9) && ok;
  if (cluster && !quick) {
    kvpark::testing::RedisCluster c(3);
    if (!c.start()) {
      fprintf(stderr, "kvpark-remote-bench: %s\n", c.failure().c_str());
      return 1;
    }
    ok = kvpark::remote::probe_section(c.seeds(), "3-master cluster", 200) && ok;
  }
  return ok ? 0 : 1;
}
