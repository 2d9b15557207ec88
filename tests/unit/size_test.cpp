// proto/size.h: the one size grammar of kvparkd's flags, kvparkd.conf and
// kvparkctl set-limit, at its edges.
#include "proto/size.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace kvpark {
namespace {

TEST(ParseSize, AcceptsPlainBytesAndBinarySuffixes) {
  const std::pair<const char*, uint64_t> cases[] = {
      {"0", 0},           {"4096", 4096},          {"7B", 7},
      {"3K", 3ull << 10}, {"3KiB", 3ull << 10},    {"64M", 64ull << 20},
      {"64MiB", 64ull << 20}, {"1G", 1ull << 30},  {"1GiB", 1ull << 30},
      {"2T", 2ull << 40}, {"2TiB", 2ull << 40},    {"1073741824", 1ull << 30},
      {"0K", 0},          {"007M", 7ull << 20},
      {"18446744073709551615", UINT64_MAX},  // 2^64 - 1: the largest
  };
  for (const auto& [text, bytes] : cases) {
    uint64_t got = 1;
    EXPECT_TRUE(parse_size(text, got)) << text;
    EXPECT_EQ(got, bytes) << text;
  }
}

TEST(ParseSize, RefusesEmptyAndGarbageAndLeavesTheResultUntouched) {
  for (const char* text : {"", "M", "B", "KiB", "1X", "1 G", "1g", "1k", "1GB", "1Gi", "1KB", "1iB",
                           "1BB", "1KK", "-", "abc", "1.5G", "1,5G", ".5G", "1e3", "0x10", "-1",
                           "-0", " 5", "5 ", "+5", "5\n"}) {
    uint64_t got = 42;
    EXPECT_FALSE(parse_size(text, got)) << text;
    EXPECT_EQ(got, 42u) << text;
  }
}

TEST(ParseSize, RefusesOverflowAtEachSuffixBoundary) {
  uint64_t got = 0;
  EXPECT_FALSE(parse_size("18446744073709551616", got));  // 2^64: N+1 without a suffix
  EXPECT_FALSE(parse_size("99999999999999999999", got));
  EXPECT_TRUE(parse_size("18014398509481983K", got));    // (2^64 - 1) >> 10
  EXPECT_EQ(got, 18014398509481983ull << 10);
  EXPECT_FALSE(parse_size("18014398509481984K", got));   // 2^54 KiB = 2^64
  EXPECT_TRUE(parse_size("17592186044415M", got));
  EXPECT_FALSE(parse_size("17592186044416M", got));
  EXPECT_TRUE(parse_size("17179869183G", got));
  EXPECT_FALSE(parse_size("17179869184G", got));
  EXPECT_TRUE(parse_size("16777215T", got));             // 2^24 - 1 TiB fits in 64 bits
  EXPECT_FALSE(parse_size("16777216T", got));            // 2^64 does not
  EXPECT_FALSE(parse_size("16777216TiB", got));
}

TEST(FormatSize, UsesTheLargestExactSuffix) {
  EXPECT_EQ(format_size(0), "0");
  EXPECT_EQ(format_size(1), "1");
  EXPECT_EQ(format_size(1023), "1023");
  EXPECT_EQ(format_size(1024), "1K");
  EXPECT_EQ(format_size(4096), "4K");
  EXPECT_EQ(format_size(4097), "4097");
  EXPECT_EQ(format_size(1536ull << 20), "1536M");
  EXPECT_EQ(format_size(1ull << 30), "1G");
  EXPECT_EQ(format_size(3ull << 40), "3T");
  EXPECT_EQ(format_size(1ull << 50), "1024T");  // T is the largest suffix
  EXPECT_EQ(format_size(UINT64_MAX), "18446744073709551615");
}

TEST(FormatSize, ParseSizeReadsEveryFormBack) {
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{1023}, uint64_t{4097}, uint64_t{1} << 10,
                         uint64_t{1536} << 20, uint64_t{16777215} << 40, UINT64_MAX,
                         UINT64_MAX - 1023}) {
    uint64_t back = 1;
    ASSERT_TRUE(parse_size(format_size(bytes), back)) << format_size(bytes);
    EXPECT_EQ(back, bytes);
  }
}

}  // namespace
}  // namespace kvpark
