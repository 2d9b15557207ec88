// One kvpark_client used from several threads at once (kvpark.h: "one kvpark_client may be
// used from several threads at once"), against a real kvparkd: every thread parks its own
// prompt and a shared one, restores both byte for byte, and reads stats meanwhile. Built
// under ThreadSanitizer in CI (suite 'client'), where a race on the channel is a failure.
#include <gtest/gtest.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr uint64_t ns_low = 0x5a4ed;
constexpr uint32_t block_tokens = 16;
constexpr uint64_t block_bytes = 4096;
constexpr int threads_count = 4;
constexpr int rounds = 25;

TEST(SharedClient, ThreadsParkAndRestoreThroughOneClient) {
  if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << "kvparkd did not start; log: " << daemon.log_path();
  ClientPtr client = connect_client(daemon.socket_path(),
                                    engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> shared = engine_prompt(1, 8 * block_tokens + 5);
  std::atomic<int> mismatches{0};
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < threads_count; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round) {
        const std::vector<int32_t> own =
            engine_prompt(1, 4 * block_tokens, 1000 + t * rounds + round, 2 * block_tokens + 1);
        for (const std::vector<int32_t>* tokens : {&shared, &own}) {
          const kvpark_status parked = park_blocks(client.get(), ns_low, block_bytes, *tokens,
                                                   static_cast<uint64_t>(t + 1));
          if (parked != KVPARK_OK) ++errors;
          kvpark_plan* raw = nullptr;
          if (kvpark_lookup(client.get(), static_cast<uint64_t>(t + 1), tokens->data(),
                            tokens->size(), &raw) != KVPARK_OK) {
            ++errors;
            continue;
          }
          PlanPtr plan(raw);
          // Another thread may still be writing the shared prompt: what is restorable is
          // sealed, so it must match; our own prompt must be there whole.
          if (!plan_blocks_match(plan.get(), ns_low, block_bytes, *tokens, block_tokens)) {
            ++mismatches;
          }
          // Our own prompt is there whole once every engine that was writing a block
          // of it has sealed: its head is shared with `shared`, and a block another
          // thread held InFlight was not ours to write. A lost block never comes back.
          const uint32_t whole = static_cast<uint32_t>(own.size() / block_tokens * block_tokens);
          if (tokens == &own && kvpark_plan_restorable_tokens(plan.get()) != whole &&
              !wait_until([&] {
                kvpark_plan* again = nullptr;
                if (kvpark_lookup(client.get(), static_cast<uint64_t>(t + 1), own.data(), own.size(),
                                  &again) != KVPARK_OK) {
                  return false;
                }
                const bool complete = kvpark_plan_restorable_tokens(again) == whole;
                kvpark_plan_release(again);
                return complete;
              })) {
            ++mismatches;
          }
        }
        kvpark_stats stats{};
        if (kvpark_get_stats(client.get(), &stats) != KVPARK_OK) ++errors;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(mismatches.load(), 0);
  kvpark_stats stats{};
  ASSERT_EQ(kvpark_get_stats(client.get(), &stats), KVPARK_OK);
  EXPECT_EQ(stats.reservations, 0u);
  client.reset();
  EXPECT_EQ(daemon.stop(), 0);
}

// Whether thread `tid` of this process is blocked in recvmsg(2) now (false where
// /proc does not say).
bool blocked_in_recvmsg(pid_t tid) {
  std::ifstream syscall("/proc/self/task/" + std::to_string(tid) + "/syscall");
  long number = -1;
  return static_cast<bool>(syscall >> number) && number == SYS_recvmsg;
}

// A thread waiting for another engine's prefill (single flight) must not hold the
// shared client's connection for the whole wait: its other threads' calls get through
// meanwhile, and the waiter is woken when the other engine seals. (The wait used to be
// one WAIT, holding the connection throughout: the stats calls below then waited for
// it, so the seal came only after the wait had timed out.)
TEST(SharedClient, ThreadWaitingOnAnotherEnginesPrefillLeavesTheClientToItsOtherThreads) {
  if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  if (!std::ifstream("/proc/self/task/" + std::to_string(gettid()) + "/syscall")) {
    GTEST_SKIP() << "no /proc/self/task/*/syscall to tell a blocked thread";
  }
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start()) << "kvparkd did not start; log: " << daemon.log_path();
  const kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
  ClientPtr leader = connect_client(daemon.socket_path(), ns);
  ClientPtr shared = connect_client(daemon.socket_path(), ns);
  ASSERT_NE(leader, nullptr);
  ASSERT_NE(shared, nullptr);
  const std::vector<int32_t> head = engine_prompt(7, 4 * block_tokens + 1);
  kvpark_publish_options options{1, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* prefilling = nullptr;
  ASSERT_EQ(
      kvpark_reserve_blocks(leader.get(), &options, head.data(), head.size(), 0, 4, &prefilling),
      KVPARK_OK);

  constexpr uint32_t wait_msec = 60'000;  // the seal ends it long before
  std::atomic<pid_t> waiter_tid{0};
  std::atomic<int> waited{-1};
  std::atomic<uint32_t> restorable{0};
  std::thread waiter([&] {
    kvpark_plan* raw = nullptr;
    if (kvpark_lookup(shared.get(), 2, head.data(), head.size(), &raw) != KVPARK_OK) return;
    PlanPtr plan(raw);
    if (kvpark_plan_inflight_tokens(plan.get()) != 4 * block_tokens) return;
    waiter_tid = gettid();
    waited = kvpark_plan_wait(plan.get(), wait_msec);
    restorable = kvpark_plan_restorable_tokens(plan.get());
  });
  ASSERT_TRUE(wait_until([&] { return waiter_tid != 0 && blocked_in_recvmsg(waiter_tid); }))
      << "the waiter never waited";
  // The other threads' calls, while it waits.
  bool others_served = true;
  for (int call = 0; call < 5 && others_served; ++call) {
    kvpark_stats stats{};
    others_served = kvpark_get_stats(shared.get(), &stats) == KVPARK_OK;
  }
  EXPECT_EQ(waited.load(), -1) << "the wait ended before the leader sealed";
  for (size_t i = 0; i < 4; ++i) {
    fill_payload(payload_key(block_hashes(ns_low, head, block_tokens)[i]),
                 kvpark_reservation_block(prefilling, i), block_bytes);
  }
  ASSERT_EQ(kvpark_seal(prefilling), KVPARK_OK);
  waiter.join();
  EXPECT_TRUE(others_served);
  EXPECT_EQ(waited.load(), KVPARK_OK) << "the seal must wake the waiter";
  EXPECT_EQ(restorable.load(), 4 * block_tokens);
  shared.reset();
  leader.reset();
  EXPECT_EQ(daemon.stop(), 0);
}

// Parks `state` as the snapshot after tokens[0, position) through c.
void park_state(kvpark_client* c, const std::vector<int32_t>& tokens, uint32_t position,
                const std::vector<uint8_t>& state) {
  const kvpark_publish_options options{.session_id = 1,
                                       .entry_class = KVPARK_CLASS_SHARED,
                                       .evidence = KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_snapshot(c, &options, tokens.data(), position, state.size(), &r),
            KVPARK_OK);
  ASSERT_EQ(kvpark_reservation_write_snapshot(r, 0, state.data(), state.size()), KVPARK_OK);
  ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
}

// The parked snapshot as c finds it: its address in c's mapping of the arena, and
// its bytes (a verified copy).
const void* find_state(kvpark_client* c, const std::vector<int32_t>& tokens,
                       std::vector<uint8_t>* ret_bytes) {
  kvpark_plan* plan = nullptr;
  EXPECT_EQ(kvpark_lookup(c, 2, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  uint64_t bytes = 0;
  const void* at = kvpark_plan_snapshot(plan, &bytes, nullptr);
  ret_bytes->assign(bytes, 0);
  EXPECT_EQ(kvpark_plan_copy_snapshot(plan, ret_bytes->data(), bytes), KVPARK_OK);
  kvpark_plan_release(plan);
  return at;
}

// Clients of one process connected to one daemon share one mapping of its arena
// (page tables filled once: a restore through a new client takes no faults), also
// once the client that mapped it is gone; another daemon's arena is mapped apart.
TEST(SharedClient, ClientsOfOneProcessShareTheMappingOfTheirDaemonsArena) {
  if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
  DaemonProcess daemon, other{{.label = "other"}};
  ASSERT_TRUE(daemon.start()) << "kvparkd did not start; log: " << daemon.log_path();
  ASSERT_TRUE(other.start()) << "kvparkd did not start; log: " << other.log_path();
  const kvpark_namespace space = engine_namespace(ns_low + 1, 0, 0);  // snapshots only
  const std::vector<int32_t> tokens = engine_prompt(3, 300);
  std::vector<uint8_t> state(1 << 20);
  for (size_t i = 0; i < state.size(); ++i) state[i] = uint8_t(i * 131 + 7);

  ClientPtr first = connect_client(daemon.socket_path(), space);
  ASSERT_NE(first, nullptr);
  ASSERT_NO_FATAL_FAILURE(park_state(first.get(), tokens, 200, state));
  std::vector<uint8_t> read;
  const void* mapped_by_first = find_state(first.get(), tokens, &read);
  ASSERT_NE(mapped_by_first, nullptr);
  EXPECT_EQ(read, state);

  ClientPtr second = connect_client(daemon.socket_path(), space);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(find_state(second.get(), tokens, &read), mapped_by_first);
  EXPECT_EQ(read, state);
  first.reset();  // the second client keeps the mapping
  ClientPtr third = connect_client(daemon.socket_path(), space);
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(find_state(third.get(), tokens, &read), mapped_by_first);
  EXPECT_EQ(read, state);

  ClientPtr elsewhere = connect_client(other.socket_path(), space);
  ASSERT_NE(elsewhere, nullptr);
  ASSERT_NO_FATAL_FAILURE(park_state(elsewhere.get(), tokens, 200, state));
  const void* mapped_elsewhere = find_state(elsewhere.get(), tokens, &read);
  EXPECT_NE(mapped_elsewhere, nullptr);
  EXPECT_NE(mapped_elsewhere, mapped_by_first);
  EXPECT_EQ(read, state);
}

}  // namespace
}  // namespace kvpark::testing
