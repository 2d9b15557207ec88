// kvparkd's command line: sizes with suffixes, defaults, and flag errors.
#include "daemon/options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

TEST(ParseSize, AcceptsPlainBytesAndBinarySuffixes) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"0", 0},           {"4096", 4096},          {"7B", 7},
      {"3K", 3ull << 10}, {"3KiB", 3ull << 10},    {"64M", 64ull << 20},
      {"64MiB", 64ull << 20}, {"1G", 1ull << 30},  {"1GiB", 1ull << 30},
      {"2T", 2ull << 40}, {"2TiB", 2ull << 40},    {"1073741824", 1ull << 30},
  };
  for (const auto& [text, bytes] : cases) {
    uint64_t got = 1;
    EXPECT_TRUE(parse_size(text, got)) << text;
    EXPECT_EQ(got, bytes) << text;
  }
}

TEST(ParseSize, RejectsGarbageAndLeavesResultUntouched) {
  for (const char* text : {"", "M", "1X", "1 G", "1g", "1GB", "1Gi", "-", "abc", "1.5G",
                           "99999999999999999999", "16777216T", "18446744073709551616", "-1", "-0", " 5",
                           "+5"}) {
    uint64_t got = 42;
    EXPECT_FALSE(parse_size(text, got)) << text;
    EXPECT_EQ(got, 42u) << text;
  }
}

TEST(ParseSize, RejectsOverflowAtTheBoundary) {
  uint64_t got = 0;
  EXPECT_TRUE(parse_size("16777215T", got));  // 2^24 - 1 TiB fits in 64 bits
  EXPECT_FALSE(parse_size("16777216T", got)); // 2^64 does not
}

// Runs parse_options over a vector of arguments (argv[0] added).
bool parse(std::vector<std::string> args, DaemonOptions& ret, int& ret_exit) {
  args.insert(args.begin(), "kvparkd");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  const bool ok = parse_options(static_cast<int>(args.size()), argv.data(), ret, ret_exit);
  ::testing::internal::GetCapturedStdout();
  ::testing::internal::GetCapturedStderr();
  return ok;
}

TEST(DaemonOptions, DefaultsWithoutFlags) {
  DaemonOptions o;
  int exit_code = -1;
  ASSERT_TRUE(parse({}, o, exit_code));
  EXPECT_EQ(o.arena_bytes, limits::arena_bytes_default);
  EXPECT_EQ(o.reservation_bytes_max, o.arena_bytes / 2);
  EXPECT_FALSE(o.socket_path.empty());
  EXPECT_EQ(o.arena_name.rfind("/kvpark-arena-", 0), 0u);
}

TEST(DaemonOptions, FlagsOverrideDefaults) {
  DaemonOptions o;
  int exit_code = -1;
  ASSERT_TRUE(parse({"--socket", "/tmp/x.sock", "--arena-size", "64M", "--arena-name", "/a",
                     "--reservation-max", "8M", "--attach-group", "wheel"},
                    o, exit_code));
  EXPECT_EQ(o.socket_path, "/tmp/x.sock");
  EXPECT_EQ(o.arena_bytes, 64ull << 20);
  EXPECT_EQ(o.arena_name, "/a");
  EXPECT_EQ(o.reservation_bytes_max, 8ull << 20);
  EXPECT_EQ(o.attach_group, "wheel");
}

TEST(DaemonOptions, ReservationDefaultFollowsArenaSize) {
  DaemonOptions o;
  int exit_code = -1;
  ASSERT_TRUE(parse({"--arena-size", "256M"}, o, exit_code));
  EXPECT_EQ(o.reservation_bytes_max, 128ull << 20);
}

TEST(DaemonOptions, ArenaSizeAtMinimumAndOneByteBelow) {
  DaemonOptions o;
  int exit_code = -1;
  EXPECT_TRUE(parse({"--arena-size", std::to_string(limits::arena_bytes_min)}, o, exit_code));
  EXPECT_FALSE(parse({"--arena-size", std::to_string(limits::arena_bytes_min - 1)}, o, exit_code));
  EXPECT_EQ(exit_code, 2);
}

TEST(DaemonOptions, BadFlagsExitWithUsageError) {
  const std::vector<std::vector<std::string>> bad = {
      {"--arena-size", "lots"}, {"--arena-size", "1X"}, {"--reservation-max", "0"},
      {"--reservation-max", "x"}, {"--no-such-flag"}, {"stray-argument"}, {"--socket"},
  };
  for (const auto& args : bad) {
    DaemonOptions o;
    int exit_code = -1;
    EXPECT_FALSE(parse(args, o, exit_code)) << args[0];
    EXPECT_EQ(exit_code, 2) << args[0];
  }
}

TEST(DaemonOptions, HelpExitsZero) {
  for (const char* flag : {"--help", "-h"}) {
    DaemonOptions o;
    int exit_code = -1;
    EXPECT_FALSE(parse({flag}, o, exit_code));
    EXPECT_EQ(exit_code, 0);
  }
}

}  // namespace
}  // namespace kvpark::daemon
