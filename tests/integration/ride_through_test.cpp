// Engines ride through a daemon restart that adopted the arena: a client connected
// across it keeps its mapping (the arena's identity outlives the daemon's
// incarnation), and no adopted extent is reused while an engine of the previous
// instance may still be reading a lease it held when that instance died, or writing
// into an extent it had reserved.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

using std::to_string;

constexpr uint64_t ns_low = 0x41d0;
constexpr uint32_t block_tokens = 64;
constexpr uint64_t block_bytes = 64 * 1024;

// Lines of this process's memory map naming `needle` (the arena's memfds).
size_t mappings_of(const std::string& needle) {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(needle) != std::string::npos;
  return n;
}

bool log_has(const DaemonProcess& daemon, const std::string& needle) {
  std::ifstream in(daemon.log_path());
  for (std::string line; std::getline(in, line);) {
    if (line.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Looks `tokens` up, checks every restored byte; the first block's address in our
// mapping (null when nothing restored).
const void* restore_and_check(kvpark_client* c, const std::vector<int32_t>& tokens,
                              uint32_t& ret_restored) {
  kvpark_plan* raw = nullptr;
  EXPECT_EQ(kvpark_lookup(c, 1, tokens.data(), tokens.size(), &raw), KVPARK_OK);
  PlanPtr plan(raw);
  ret_restored = plan ? kvpark_plan_restorable_tokens(plan.get()) : 0;
  if (!plan || kvpark_plan_block_count(plan.get()) == 0) return nullptr;
  EXPECT_TRUE(plan_blocks_match(plan.get(), ns_low, block_bytes, tokens, block_tokens));
  return kvpark_plan_block(plan.get(), 0);
}

class RideThrough : public ::testing::TestWithParam<bool> {};  // SIGKILL (true) or SIGTERM

TEST_P(RideThrough, ConnectedEngineRestoresThroughItsOwnMappingWithoutRemapping) {
  DaemonProcess daemon({.arena_bytes = 64ull << 20, .fd_store = true});
  ASSERT_TRUE(daemon.start());
  ClientPtr c =
      connect_client(daemon.socket_path(), engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_TRUE(c);
  const std::vector<int32_t> tokens = engine_prompt(731, 1024, 2, 1);
  ASSERT_EQ(park_blocks(c.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
  uint32_t restored = 0;
  const void* before = restore_and_check(c.get(), tokens, restored);
  ASSERT_NE(before, nullptr);
  ASSERT_EQ(restored, 1024u);
  const size_t mapped = mappings_of(daemon.arena_name());
  ASSERT_EQ(mapped, 2u);  // header and data

  if (GetParam()) {
    daemon.kill_hard();
  } else {
    ASSERT_EQ(daemon.stop(), 0);
  }
  ASSERT_TRUE(daemon.start());
  // The next call reconnects; the daemon passes the same arena, so the same bytes
  // are at the same address of the same mapping.
  const void* after = restore_and_check(c.get(), tokens, restored);
  EXPECT_EQ(restored, 1024u);
  EXPECT_EQ(after, before);
  EXPECT_EQ(mappings_of(daemon.arena_name()), mapped);
  // This process was the previous instance's only engine: its HELLO ends the hold.
  EXPECT_TRUE(wait_until(
      [&] { return log_has(daemon, "every engine of the previous instance came back"); }));
}

std::string stop_name(const ::testing::TestParamInfo<bool>& param_info) {
  return param_info.param ? "Sigkill" : "Sigterm";
}

INSTANTIATE_TEST_SUITE_P(AfterEachStop, RideThrough, ::testing::Bool(), stop_name);

// An engine whose next call reconnects while it still holds a plan of the previous
// instance (another thread may be copying out of it): its HELLO says so, and the
// adopted extents stay held; the old plan's bytes stay the ones it was given.
TEST(AdoptionHold, AnEngineBackWithAPlanOfThePreviousInstanceKeepsAdoptedExtentsHeld) {
  DaemonProcess daemon(
      {.arena_bytes = 16ull << 20, .reservation_bytes_max = 16ull << 20, .fd_store = true});
  ASSERT_TRUE(daemon.start());
  ClientPtr c =
      connect_client(daemon.socket_path(), engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_TRUE(c);
  const std::vector<int32_t> tokens = engine_prompt(733, 1024, 2, 1);
  ASSERT_EQ(park_blocks(c.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
  kvpark_plan* raw = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 1, tokens.data(), tokens.size(), &raw), KVPARK_OK);
  PlanPtr old_plan(raw);
  ASSERT_EQ(kvpark_plan_block_count(old_plan.get()), 16u);

  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  uint32_t restored = 0;
  ASSERT_NE(restore_and_check(c.get(), tokens, restored), nullptr);  // reconnects
  EXPECT_EQ(restored, 1024u);
  ASSERT_TRUE(wait_until([&] { return log_has(daemon, "came back still holding plans"); }));
  EXPECT_FALSE(log_has(daemon, "every engine of the previous instance came back"));

  // A prompt that fits only if adopted entries are evicted is refused meanwhile.
  const std::vector<std::string> filler = {"publish", "--head-seed", "742", "--head-tokens",
                                           to_string(230 * 64)};
  EngineRun refused = run_engine(daemon, filler);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_FALSE(log_has(daemon, "may be evicted from now on"));
  EXPECT_TRUE(plan_blocks_match(old_plan.get(), ns_low, block_bytes, tokens, block_tokens));
}

// 64 KiB blocks in a 16 MiB arena: about 240 extents; 16 of them adopted.
TEST(AdoptionHold, AdoptedExtentsAreNotReusedUntilThePreviousInstancesEnginesAreGone) {
  DaemonProcess daemon(
      {.arena_bytes = 16ull << 20, .reservation_bytes_max = 16ull << 20, .fd_store = true});
  ASSERT_TRUE(daemon.start());
  EngineRun leased = run_engine(daemon, {"publish", "--head-seed", "741"});
  ASSERT_EQ(leased.exit_code, 0) << leased.output;
  // An engine holding a lease when the daemon stops: it may still be copying out.
  ChildProcess reader = spawn_engine(daemon, {"hold-lease", "--head-seed", "741"});
  ASSERT_TRUE(reader.wait_for_line("ready", 10'000));
  ASSERT_EQ(daemon.stop(), 0);
  ASSERT_TRUE(daemon.start());

  // One 230-block prompt fits only if adopted entries are evicted: refused while
  // the reader lives, and nothing adopted is evicted.
  const std::vector<std::string> filler = {"publish", "--head-seed", "742", "--head-tokens",
                                           to_string(230 * 64)};
  EngineRun refused = run_engine(daemon, filler);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  {
    StatsClient stats(daemon.socket_path());
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats.get().evictions, 0u);
    EXPECT_EQ(stats.get().blocks, 16u);
  }
  reader.kill_hard();
  ASSERT_TRUE(wait_until([&] { return log_has(daemon, "may be evicted from now on"); }));
  EngineRun filled = run_engine(daemon, filler);
  ASSERT_EQ(filled.exit_code, 0) << filled.output;
  StatsClient stats(daemon.socket_path());
  EXPECT_GE(stats.get().evictions, 1u);
}

// An engine writing into its reservation when the daemon stopped or died may go on
// writing: the next instance holds the extent (its reservation record) until that
// engine is gone, so no new entry is placed where the old writer still writes.
class ReservationHoldAcrossStop : public ::testing::TestWithParam<bool> {
};  // SIGKILL (true) or SIGTERM

TEST_P(ReservationHoldAcrossStop,
       AnExtentReservedWhenTheDaemonStoppedIsNotReusedWhileItsWriterLives) {
  DaemonProcess daemon(
      {.arena_bytes = 16ull << 20, .reservation_bytes_max = 16ull << 20, .fd_store = true});
  ASSERT_TRUE(daemon.start());
  // 200 of the arena's ~240 extents, reserved, one written, the rest never sealed.
  ChildProcess writer = spawn_engine(
      daemon, {"hang-while-writing", "--head-seed", "743", "--head-tokens", to_string(200 * 64)});
  ASSERT_TRUE(writer.wait_for_line("ready", 10'000));
  if (GetParam()) {
    daemon.kill_hard();
  } else {
    ASSERT_EQ(daemon.stop(), 0);
  }
  ASSERT_TRUE(daemon.start());
  EXPECT_TRUE(log_has(daemon, "holding 200 extents (13 MiB) reserved when it stopped"));

  // A prompt of 100 blocks fits only in the reserved extents: refused while the writer lives.
  const std::vector<std::string> filler = {"publish", "--head-seed", "744", "--head-tokens",
                                           to_string(100 * 64)};
  EngineRun refused = run_engine(daemon, filler);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_FALSE(log_has(daemon, "may be evicted from now on"));

  writer.kill_hard();
  ASSERT_TRUE(wait_until([&] { return log_has(daemon, "may be evicted from now on"); }));
  EngineRun filled = run_engine(daemon, filler);
  ASSERT_EQ(filled.exit_code, 0) << filled.output;
  EngineRun verified =
      run_engine(daemon, {"verify", "--head-seed", "744", "--head-tokens", to_string(100 * 64)});
  EXPECT_EQ(verified.exit_code, 0) << verified.output;
}

INSTANTIATE_TEST_SUITE_P(AfterEachStop, ReservationHoldAcrossStop, ::testing::Bool(), stop_name);

// An engine that reconnects while a thread of it still holds a reservation of the
// previous instance says so in its HELLO: the extent stays held.
TEST(ReservationHold, AnEngineBackWithAReservationOfThePreviousInstanceKeepsItsExtentsHeld) {
  DaemonProcess daemon(
      {.arena_bytes = 16ull << 20, .reservation_bytes_max = 16ull << 20, .fd_store = true});
  ASSERT_TRUE(daemon.start());
  ClientPtr c =
      connect_client(daemon.socket_path(), engine_namespace(ns_low, block_tokens, block_bytes));
  ASSERT_TRUE(c);
  const std::vector<int32_t> tokens = engine_prompt(745, 200 * 64, 2, 1);
  kvpark_publish_options options{1, KVPARK_CLASS_PRIVATE, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* reservation = nullptr;
  ASSERT_EQ(
      kvpark_reserve_blocks(c.get(), &options, tokens.data(), tokens.size(), 0, 200, &reservation),
      KVPARK_OK);

  daemon.kill_hard();
  ASSERT_TRUE(daemon.start());
  // Another call of this engine reconnects while the reservation is open.
  kvpark_stats stats{};
  ASSERT_EQ(kvpark_get_stats(c.get(), &stats), KVPARK_OK);
  ASSERT_TRUE(
      wait_until([&] { return log_has(daemon, "came back still holding plans or reservations"); }));
  const std::vector<std::string> filler = {"publish", "--head-seed", "746", "--head-tokens",
                                           to_string(100 * 64)};
  EngineRun refused = run_engine(daemon, filler);
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_FALSE(log_has(daemon, "may be evicted from now on"));
  // The old reservation cannot be sealed into the new instance.
  EXPECT_EQ(kvpark_seal(reservation), KVPARK_UNAVAILABLE);
}

}  // namespace
}  // namespace kvpark::testing
