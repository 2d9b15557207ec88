// A reservation on a full arena takes what it needs (a real kvparkd, real engine
// processes): a 4 MiB snapshot on an arena full of 1 MiB heads, whose LRU order runs
// against their offsets, evicts at most its size plus one entry, where evicting in
// LRU order until some free run is long enough took far more (issue figures: 654
// entries, 8.3 MB left free for a 4 MB snapshot).
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <cstdio>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/openai_http.h"

namespace kvpark::testing {
namespace {

constexpr uint64_t arena_bytes = 64ull << 20;
constexpr uint64_t block_bytes = 64ull << 10;  // payload; an extent is a little more
constexpr uint64_t head_tokens = 1024;         // 16 blocks of 64 tokens: about 1 MiB
constexpr uint64_t snapshot_bytes = 4ull << 20;
constexpr int heads_max = 200;

uint64_t status_number(const DaemonProcess& daemon, const char* key) {
  const HttpResult r =
      http_get("http://127.0.0.1:" + std::to_string(daemon.http_port()), "/v1/status");
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  return !d.HasParseError() && d.IsObject() && d.HasMember(key) && d[key].IsUint64()
             ? d[key].GetUint64()
             : 0;
}

EngineRun run_head(const DaemonProcess& daemon, uint64_t seed, const char* mode) {
  return run_engine(daemon, {"--head-seed", std::to_string(seed), "--head-tokens",
                             std::to_string(head_tokens), "--block-bytes",
                             std::to_string(block_bytes), mode});
}

TEST(Eviction, ALargeReservationOnAFragmentedArenaTakesOnlyWhatItNeeds) {
  DaemonProcess daemon(DaemonConfig{
      .arena_bytes = arena_bytes,
      .extra_args = {"--config", "/dev/null", "--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start());
  // Heads until the arena is full: the first eviction.
  int heads = 0;
  while (heads < heads_max && status_number(daemon, "evictions") == 0) {
    const EngineRun run = run_head(daemon, uint64_t(++heads), "publish");
    ASSERT_EQ(run.exit_code, 0) << run.output;
  }
  ASSERT_GT(status_number(daemon, "evictions"), 0u) << "the arena never filled";
  // Every other head used again, newest offsets first: the coldest heads lie between
  // recent ones all over the arena.
  for (int seed = heads; seed > 0; seed -= 2) run_head(daemon, uint64_t(seed), "verify");

  const uint64_t evictions_before = status_number(daemon, "evictions");
  const uint64_t free_before = status_number(daemon, "arena_free_bytes");
  const EngineRun snapshot = run_engine(
      daemon, {"--ns", "7", "--block-tokens", "0", "--head-seed", "9999", "--head-tokens", "64",
               "--snapshot-bytes", std::to_string(snapshot_bytes), "publish"});
  ASSERT_EQ(snapshot.exit_code, 0) << snapshot.output;
  const uint64_t evicted = status_number(daemon, "evictions") - evictions_before;
  const uint64_t free_after = status_number(daemon, "arena_free_bytes");
  std::printf("kvparkd, %d heads of %llu tokens on a %llu MiB arena: a %llu MiB snapshot "
              "evicted %llu entries; free %.2f MiB before, %.2f MiB after\n",
              heads, static_cast<unsigned long long>(head_tokens),
              static_cast<unsigned long long>(arena_bytes >> 20),
              static_cast<unsigned long long>(snapshot_bytes >> 20),
              static_cast<unsigned long long>(evicted), free_before / 1048576.0,
              free_after / 1048576.0);
  // An entry here is one 64 KiB block (and its header's granule): the snapshot's need
  // plus one entry, in entries and in bytes left free.
  const uint64_t snapshot_entries = snapshot_bytes / block_bytes;
  EXPECT_LE(evicted, snapshot_entries + 2) << snapshot.output;
  EXPECT_LE(free_after, free_before + 2 * (block_bytes + (64ull << 10)));
  EXPECT_EQ(status_number(daemon, "evictions_for_room"), status_number(daemon, "evictions"))
      << "no disk tier, no low-water mark: every eviction made room";
  daemon.kill_hard();
}

}  // namespace
}  // namespace kvpark::testing
