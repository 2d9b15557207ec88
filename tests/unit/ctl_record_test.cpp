// kvparkctl's records brought to the JSON schema (ctl/record.h): 64-bit ids as
// strings, the D-Bus names mapped to the HTTP ones.
#include <gtest/gtest.h>

#include "ctl/format.h"
#include "ctl/record.h"

using namespace kvpark::ctl;

namespace {

TEST(CtlFormat, LatenciesKeepOneDecimalBelowTenOfAUnit) {
  EXPECT_EQ(format_latency_usec(0), "0us");
  EXPECT_EQ(format_latency_usec(999), "999us");
  EXPECT_EQ(format_latency_usec(1'000), "1.0ms");
  EXPECT_EQ(format_latency_usec(2'599), "2.5ms");
  EXPECT_EQ(format_latency_usec(9'999), "9.9ms");
  EXPECT_EQ(format_latency_usec(10'000), "10ms");
  EXPECT_EQ(format_latency_usec(999'999), "999ms");
  EXPECT_EQ(format_latency_usec(1'000'000), "1.0s");
  EXPECT_EQ(format_latency_usec(12'500'000), "12s");
}

TEST(CtlRecord, StatusIncarnationBecomesSixteenHexDigits) {
  const Record r = status_from_dbus(
      {{"incarnation", Value::of_number(0xb629cce28e2b6a13)}, {"entries", Value::of_number(4)}});
  EXPECT_EQ(json_of(r), R"({"entries":4,"incarnation":"b629cce28e2b6a13"})");
  EXPECT_EQ(json_of(status_from_dbus({{"incarnation", Value::of_number(1)}})),
            R"({"incarnation":"0000000000000001"})");
}

TEST(CtlRecord, EntryIdsAndSessionsAreStringsAndNamesMatchHttp) {
  const Record r = entry_from_dbus({{"id", Value::of_number(18446744073709551615ull)},
                                    {"creator_session", Value::of_number(9007199254740993ull)},
                                    {"key", Value::of_text("00ff")},
                                    {"evidence", Value::of_text("explicit_breakpoint")},
                                    {"pinned", Value::of_flag(true)}});
  EXPECT_EQ(json_of(r), R"({"creator_session":"9007199254740993","evidence":"explicit_breakpoint",)"
                        R"("id":"18446744073709551615","key_hash":"00ff","pinned":true})");
  EXPECT_EQ(number_of(r, "id"), 18446744073709551615ull) << "the string still reads as a number";
}

TEST(CtlRecord, StatsKeepFiguresAndTheIncarnation) {
  const Record status = status_from_dbus({{"incarnation", Value::of_number(7)},
                                          {"version", Value::of_text("0.1.0")},
                                          {"disk_enabled", Value::of_flag(false)},
                                          {"spills", Value::of_number(3)}});
  EXPECT_EQ(json_of(stats_of(status)), R"({"incarnation":"0000000000000007","spills":3})");
}

TEST(CtlRecord, ProgressJobIsAString) {
  EXPECT_EQ(
      json_of(progress_from_dbus({{"job", Value::of_number(2)}, {"done", Value::of_flag(true)}})),
      R"({"done":true,"job":"2"})");
}

}  // namespace
