// proto/names.h: the one spelling of ids and enumerated values every door uses.
#include "proto/names.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kvpark {
namespace {

TEST(Hex128, PrintsThirtyTwoLowercaseDigitsHighWordFirst) {
  EXPECT_EQ(hex128({.low = 0x0123456789abcdefull, .high = 0xfedcba9876543210ull}),
            "fedcba98765432100123456789abcdef");
  EXPECT_EQ(hex128({}), std::string(32, '0'));
  EXPECT_EQ(hex128({.low = 7}), "00000000000000000000000000000007");
}

TEST(Hex64, PrintsSixteenLowercaseDigits) {
  EXPECT_EQ(hex64(0xb629cce28e2b6a13ull), "b629cce28e2b6a13");
  EXPECT_EQ(hex64(1), "0000000000000001");
}

TEST(ParseHex128, ReadsWhatHex128Prints) {
  const Hash128 value{.low = 0x0123456789abcdefull, .high = 0xfedcba9876543210ull};
  Hash128 back;
  ASSERT_TRUE(parse_hex128(hex128(value), back));
  EXPECT_EQ(back, value);
}

TEST(ParseHex128, TakesShortIdsZeroXAndEitherCase) {
  const std::pair<const char*, Hash128> cases[] = {
      {"7", {.low = 7}},
      {"0x7", {.low = 7}},
      {"1" "0000000000000000", {.low = 0, .high = 1}},  // 17 digits: one into the high word
      {"FFFFFFFFFFFFFFFFffffffffffffffff", {.low = ~0ull, .high = ~0ull}},
      {"0x00000000000000000000000000000008", {.low = 8}},  // 32 digits after 0x
  };
  for (const auto& [text, want] : cases) {
    Hash128 got{.low = 42, .high = 42};
    EXPECT_TRUE(parse_hex128(text, got)) << text;
    EXPECT_EQ(got, want) << text;
  }
}

TEST(ParseHex128, RefusesAnythingElseAndLeavesTheResultUntouched) {
  for (const char* text : {"", "0x", "0X7", "g", "7g", " 7", "7 ", "-7", "+7", "0x-7", "x7",
                           "000000000000000000000000000000007",  // 33 digits: N+1
                           "0x000000000000000000000000000000007"}) {
    Hash128 got{.low = 42, .high = 42};
    EXPECT_FALSE(parse_hex128(text, got)) << text;
    EXPECT_EQ(got, (Hash128{.low = 42, .high = 42})) << text;
  }
}

// Every value has its own snake_case word, and the parsers invert the printers.
TEST(Names, EveryValueHasItsOwnSnakeCaseWord) {
  std::set<std::string> evidence;
  for (uint8_t e = 0; e <= evidence_max; ++e) evidence.insert(evidence_name(Evidence(e)));
  EXPECT_EQ(evidence.size(), size_t(evidence_max) + 1);
  EXPECT_STREQ(evidence_name(Evidence::DefaultAutomatic), "default_automatic");
  EXPECT_STREQ(evidence_name(Evidence::ObservedRecurrence), "observed_recurrence");
  for (const std::string& name : evidence) {
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << name;
  }

  for (Tier t : {Tier::Host, Tier::Disk, Tier::Both}) {
    Tier back = t == Tier::Host ? Tier::Disk : Tier::Host;
    ASSERT_TRUE(parse_tier(tier_name(t), back)) << tier_name(t);
    EXPECT_EQ(back, t);
  }
  for (EntryClass c : {EntryClass::Shared, EntryClass::Private}) {
    EntryClass back = c == EntryClass::Shared ? EntryClass::Private : EntryClass::Shared;
    ASSERT_TRUE(parse_entry_class(entry_class_name(c), back)) << entry_class_name(c);
    EXPECT_EQ(back, c);
  }
  EXPECT_STREQ(entry_kind_name(EntryKind::Block), "block");
  EXPECT_STREQ(entry_kind_name(EntryKind::Snapshot), "snapshot");

  EXPECT_STREQ(reuse_kind_name(ReuseKind::Root), "root");
  EXPECT_STREQ(reuse_kind_name(ReuseKind::SharedStablePrefix), "shared_stable_prefix");
  EXPECT_STREQ(reuse_kind_name(ReuseKind::PrivateTurnClosure), "private_turn_closure");
  EXPECT_STREQ(reuse_kind_name(ReuseKind(reuse_kind_max + 1)), "?");
}

TEST(Names, ParsersRefuseOtherWordsAndLeaveTheResultUntouched) {
  for (const char* text : {"", "Host", "host ", "ssd", "default-automatic"}) {
    Tier tier = Tier::Both;
    EXPECT_FALSE(parse_tier(text, tier)) << text;
    EXPECT_EQ(tier, Tier::Both);
    EntryClass c = EntryClass::Shared;
    EXPECT_FALSE(parse_entry_class(text, c)) << text;
    EXPECT_EQ(c, EntryClass::Shared);
  }
}

}  // namespace
}  // namespace kvpark
