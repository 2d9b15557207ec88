// Contention for a full arena, with a real kvparkd and real engine processes:
//  - a reservation takes what it needs: a 4 MiB snapshot on an arena full of 1 MiB
//    heads, whose LRU order runs against their offsets, evicts at most its size plus
//    one entry, where evicting in LRU order until some free run is long enough took far
//    more (548 entries, half the arena left free, from the daemon before this rule);
//  - a hog holding reservations it never seals stops at its connection's quota of
//    unsealed bytes (a quarter of the arena), refused with the reason logged, and the
//    other engine's heads keep the rest.
#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <vector>
#include <string>

#include "tests/testing/daemon_process.h"
#include "tests/testing/daemon_status.h"
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
  return daemon_status_number(daemon, key);
}

EngineRun run_head(const DaemonProcess& daemon, uint64_t seed, const char* mode) {
  return run_engine(daemon, {"--head-seed", std::to_string(seed), "--head-tokens",
                             std::to_string(head_tokens), "--block-bytes",
                             std::to_string(block_bytes), mode});
}

// Publishes heads (seeds 1, 2, ...) until the arena is full: the first eviction. How
// many it published.
int fill_with_heads(const DaemonProcess& daemon) {
  int heads = 0;
  while (heads < heads_max && status_number(daemon, "evictions") == 0) {
    const EngineRun run = run_head(daemon, uint64_t(++heads), "publish");
    EXPECT_EQ(run.exit_code, 0) << run.output;
  }
  return heads;
}

TEST(Eviction, ALargeReservationOnAFragmentedArenaTakesOnlyWhatItNeeds) {
  DaemonProcess daemon(DaemonConfig{
      .arena_bytes = arena_bytes,
      .extra_args = {"--config", "/dev/null", "--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start());
  const int heads = fill_with_heads(daemon);
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

// A child process holding one connection that reserves 64-block extents and never
// seals them, until refused; it reports how many it got and the refusal, then holds
// them until the parent lets go.
class Hog {
 public:
  explicit Hog(const std::string& socket) {
    int report[2], hold[2];
    if (pipe(report) != 0 || pipe(hold) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(report[0]);
      close(hold[1]);
      const kvpark_namespace ns = {.id = {0x4064, 0},
                                   .block_tokens = 64,
                                   .block_payload_bytes = block_bytes,
                                   .snapshot_required = 0,
                                   .prefill_tokens_per_second = 0,
                                   .client_name = "hog"};
      kvpark_client* c = nullptr;
      int32_t result[2] = {0, KVPARK_OK};  // reservations held, the refusal
      if (kvpark_connect(socket.c_str(), &ns, &c) == KVPARK_OK) {
        std::vector<kvpark_reservation*> held;
        for (int32_t i = 0; i < 1000 && result[1] == KVPARK_OK; ++i) {
          std::vector<int32_t> tokens(64 * 64, i);
          kvpark_reservation* r = nullptr;
          const kvpark_publish_options options{};
          result[1] = kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, 64, &r);
          if (result[1] == KVPARK_OK) held.push_back(r);
        }
        result[0] = int32_t(held.size());
      }
      (void)!write(report[1], result, sizeof result);
      char byte;
      (void)!read(hold[0], &byte, 1);
      _exit(0);
    }
    close(report[1]);
    close(hold[0]);
    hold_fd_ = hold[1];
    if (read(report[0], result_, sizeof result_) != sizeof result_) result_[0] = -1;
    close(report[0]);
  }
  ~Hog() {
    if (hold_fd_ >= 0) close(hold_fd_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  int reservations() const { return result_[0]; }
  kvpark_status refusal() const { return kvpark_status(result_[1]); }

 private:
  pid_t pid_ = -1;
  int hold_fd_ = -1;
  int32_t result_[2] = {-1, KVPARK_OK};
};

TEST(Eviction, AHogOfUnsealedReservationsStopsAtItsQuota) {
  DaemonProcess daemon(DaemonConfig{
      .arena_bytes = arena_bytes,
      .extra_args = {"--config", "/dev/null", "--http-listen", "127.0.0.1:0"}});
  ASSERT_TRUE(daemon.start());
  const int heads = fill_with_heads(daemon);
  Hog hog(daemon.socket_path());
  ASSERT_GE(hog.reservations(), 0) << "the hog failed";
  // What the other engine's heads still hold, verified byte for byte.
  int restorable = 0;
  for (int seed = 1; seed <= heads; ++seed) {
    const EngineRun run = run_head(daemon, uint64_t(seed), "verify");
    restorable += run.exit_code == 0 && run.output.find("restored 0 ") == std::string::npos;
  }
  const uint64_t quota = arena_bytes / 4;  // kvparkd's default unsealed_per_connection
  std::printf("kvparkd, %d heads of about 1 MiB on a %llu MiB arena: a hog holding 4 MiB "
              "reservations got %d before %s; %d heads restorable after\n",
              heads, static_cast<unsigned long long>(arena_bytes >> 20), hog.reservations(),
              kvpark_status_string(hog.refusal()), restorable);
  EXPECT_EQ(hog.refusal(), KVPARK_LIMIT_EXCEEDED);
  EXPECT_LE(uint64_t(hog.reservations()) * 64 * block_bytes, quota);
  EXPECT_GE(status_number(daemon, "unsealed_quota_refusals"), 1u);
  // The heads keep all but what the hog's quota took, and a head's worth for rounding.
  EXPECT_GE(restorable, heads - int(quota >> 20) - 2);
  std::ifstream log(daemon.log_path());
  const std::string text{std::istreambuf_iterator<char>(log), {}};
  EXPECT_NE(text.find("past unsealed_per_connection"), std::string::npos) << text;
  daemon.kill_hard();
}

}  // namespace
}  // namespace kvpark::testing
