// The daemon's life as a client sees it: absent, restarted under a connected
// client, and stopped by SIGTERM or SIGINT.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client/channel.h"
#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"

namespace kvpark::testing {
namespace {

using Clock = std::chrono::steady_clock;
// "At once": a call that hung would last the library's whole reply timeout; a loaded
// machine is slower than usual, never that slow.
constexpr auto at_once = std::chrono::milliseconds(client::reply_timeout_msec / 3);

constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 16 * 1024;
constexpr uint64_t ns_low = 1;

bool path_exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

bool shm_exists(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return errno != ENOENT;
  close(fd);
  return true;
}

TEST(Reconnect, ConnectWithoutDaemonIsUnavailableAtOnce) {
  char dir_template[] = "/tmp/kvpark-nodaemon-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const std::string socket = dir + "/kvparkd.sock";
  const auto started = Clock::now();
  kvpark_status status = KVPARK_OK;
  ClientPtr client = connect_client(socket, engine_namespace(ns_low, block_tokens, block_bytes),
                                    &status);
  EXPECT_EQ(status, KVPARK_UNAVAILABLE) << kvpark_status_string(status);
  EXPECT_EQ(client, nullptr);
  EXPECT_LT(Clock::now() - started, at_once);
  rmdir(dir.c_str());

  // A daemon that was there and stopped leaves no socket to hang on.
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  ASSERT_EQ(daemon.stop(), 0);
  const auto again = Clock::now();
  client = connect_client(daemon.socket_path(),
                          engine_namespace(ns_low, block_tokens, block_bytes), &status);
  EXPECT_EQ(status, KVPARK_UNAVAILABLE) << kvpark_status_string(status);
  EXPECT_LT(Clock::now() - again, at_once);
}

TEST(Reconnect, ClientSurvivesDaemonRestart) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  ClientPtr client = connect_client(daemon.socket_path(),
                                    engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> parked = engine_prompt(71, 1024);
  const std::vector<int32_t> pending = engine_prompt(72, 1024);
  ASSERT_EQ(park_blocks(client.get(), ns_low, block_bytes, parked, 1), KVPARK_OK);

  // Held across the restart: a plan (with a lease) and an unsealed reservation.
  kvpark_plan* old_plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client.get(), 1, parked.data(), parked.size(), &old_plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_restorable_tokens(old_plan), full_restore_tokens(1024, block_tokens));
  kvpark_publish_options options{1, KVPARK_CLASS_PRIVATE, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* old_reservation = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(client.get(), &options, pending.data(), pending.size(), 0, 16,
                                  &old_reservation),
            KVPARK_OK);

  // Same socket path and arena name, a new incarnation; the client is not told.
  ASSERT_TRUE(daemon.restart());
  // Its next call reconnects; the host tier of the old incarnation is gone.
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client.get(), 1, parked.data(), parked.size(), &plan), KVPARK_OK);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 0u);
  kvpark_plan_release(plan);
  kvpark_stats s{};
  ASSERT_EQ(kvpark_get_stats(client.get(), &s), KVPARK_OK);
  EXPECT_EQ(s.connections, 1u);
  EXPECT_EQ(s.blocks, 0u);

  // While no daemon runs, calls fail at once; the first call after it is back works.
  ASSERT_EQ(daemon.stop(), 0);
  const auto down = Clock::now();
  EXPECT_EQ(kvpark_lookup(client.get(), 1, parked.data(), parked.size(), &plan),
            KVPARK_UNAVAILABLE);
  EXPECT_EQ(kvpark_get_stats(client.get(), &s), KVPARK_UNAVAILABLE);
  EXPECT_LT(Clock::now() - down, at_once);
  ASSERT_TRUE(daemon.start());
  ASSERT_EQ(kvpark_get_stats(client.get(), &s), KVPARK_OK);
  EXPECT_EQ(s.connections, 1u);

  // The old plan's bytes stay mapped and intact; releasing it is harmless.
  EXPECT_TRUE(plan_blocks_match(old_plan, ns_low, block_bytes, parked, block_tokens));
  kvpark_plan_release(old_plan);
  // The old reservation is unknown to the new daemon: it cannot be sealed.
  fill_payload(1, kvpark_reservation_block(old_reservation, 0), block_bytes);
  EXPECT_EQ(kvpark_seal(old_reservation), KVPARK_UNAVAILABLE);
  ASSERT_EQ(kvpark_get_stats(client.get(), &s), KVPARK_OK);
  EXPECT_EQ(s.leases, 0u);
  EXPECT_EQ(s.reservations, 0u);
  EXPECT_EQ(s.blocks, 0u);

  // Publishing and restoring work on the new incarnation, in and out of process.
  size_t written = 0;
  ASSERT_EQ(park_blocks(client.get(), ns_low, block_bytes, pending, 1, &written), KVPARK_OK);
  EXPECT_EQ(written, 16u);
  ASSERT_EQ(kvpark_lookup(client.get(), 1, pending.data(), pending.size(), &plan), KVPARK_OK);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), full_restore_tokens(1024, block_tokens));
  EXPECT_TRUE(plan_blocks_match(plan, ns_low, block_bytes, pending, block_tokens));
  kvpark_plan_release(plan);
  EngineRun v = run_engine(daemon, {"verify", "--head-seed", "72", "--block-bytes",
                                    std::to_string(block_bytes)});
  EXPECT_EQ(v.exit_code, 0) << v.output;
  const auto r = restores_in(v.output);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].tokens, full_restore_tokens(1024, block_tokens));
}

// A daemon that is there but does not answer (stopped, hung): the first call waits out
// the client's reply timeout; the calls after it, from any thread, fail at once rather
// than each waiting as long behind it; once the daemon answers again, so do calls.
TEST(Reconnect, SilentDaemonCostsOneReplyTimeoutThenCallsFailAtOnce) {
  constexpr uint32_t reply_timeout_msec = 2'000;
  constexpr int threads = 8;
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  const kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
  kvpark_client* raw = nullptr;
  EXPECT_EQ(kvpark_connect_with_reply_timeout(daemon.socket_path().c_str(), &ns, 999, &raw),
            KVPARK_INVALID_ARGUMENT);
  ASSERT_EQ(kvpark_connect_with_reply_timeout(daemon.socket_path().c_str(), &ns, reply_timeout_msec,
                                              &raw),
            KVPARK_OK);
  ClientPtr client(raw);
  const std::vector<int32_t> parked = engine_prompt(73, 1024);
  ASSERT_EQ(park_blocks(client.get(), ns_low, block_bytes, parked, 1), KVPARK_OK);

  ASSERT_EQ(kill(daemon.pid(), SIGSTOP), 0);
  struct Resume {  // whatever fails below, the daemon is not left stopped
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{daemon.pid()};
  kvpark_plan* plan = nullptr;
  const auto silent = Clock::now();
  EXPECT_EQ(kvpark_lookup(client.get(), 1, parked.data(), parked.size(), &plan),
            KVPARK_UNAVAILABLE);
  EXPECT_GE(Clock::now() - silent, std::chrono::milliseconds(reply_timeout_msec));
  // Without the backoff each of these would wait the timeout out in turn (16 s).
  const auto after = Clock::now();
  std::atomic<int> unavailable{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < threads; ++t)
    callers.emplace_back([&] {
      kvpark_stats s{};
      if (kvpark_get_stats(client.get(), &s) == KVPARK_UNAVAILABLE) ++unavailable;
    });
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(unavailable.load(), threads);
  EXPECT_LT(Clock::now() - after, std::chrono::milliseconds(reply_timeout_msec));

  ASSERT_EQ(kill(daemon.pid(), SIGCONT), 0);
  // After the backoff the client asks again, and finds everything parked before.
  EXPECT_TRUE(wait_until(
      [&] {
        if (kvpark_lookup(client.get(), 1, parked.data(), parked.size(), &plan) != KVPARK_OK)
          return false;
        const bool whole =
            kvpark_plan_restorable_tokens(plan) == full_restore_tokens(1024, block_tokens);
        kvpark_plan_release(plan);
        return whole;
      },
      30'000));
}

class CleanShutdown : public ::testing::TestWithParam<int> {};

TEST_P(CleanShutdown, ExitsZeroAndRemovesSocketAndLeavesNoArena) {
  DaemonProcess daemon;
  ASSERT_TRUE(daemon.start());
  ASSERT_TRUE(path_exists(daemon.socket_path()));
  // The arena is two memfds: nothing in /dev/shm to leave behind, even after a crash.
  EXPECT_FALSE(shm_exists(daemon.arena_name()));
  // A connected client with a lease and a reservation open does not hold it up.
  ClientPtr client = connect_client(daemon.socket_path(),
                                    engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_NE(client, nullptr);
  const std::vector<int32_t> tokens = engine_prompt(73, 1024);
  ASSERT_EQ(park_blocks(client.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client.get(), 1, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  const std::vector<int32_t> more = engine_prompt(74, 1024);
  kvpark_publish_options options{1, KVPARK_CLASS_PRIVATE, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* reservation = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(client.get(), &options, more.data(), more.size(), 0, 16,
                                  &reservation),
            KVPARK_OK);

  const int status = daemon.signal_and_wait(GetParam(), 10'000);
  ASSERT_NE(status, -1) << "kvparkd did not stop";
  EXPECT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(path_exists(daemon.socket_path()));
  EXPECT_FALSE(shm_exists(daemon.arena_name()));

  EXPECT_EQ(kvpark_seal(reservation), KVPARK_UNAVAILABLE);
  kvpark_plan_release(plan);
}

INSTANTIATE_TEST_SUITE_P(Signals, CleanShutdown, ::testing::Values(SIGTERM, SIGINT),
                         [](const auto& param_info) {
                           return std::string(param_info.param == SIGTERM ? "Sigterm" : "Sigint");
                         });

}  // namespace
}  // namespace kvpark::testing
