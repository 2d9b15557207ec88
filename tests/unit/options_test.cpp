// kvparkd's command line: defaults and flag errors (sizes: size_test.cpp).
#include "daemon/command_line.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "proto/limits.h"

namespace kvpark::daemon {
namespace {

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
