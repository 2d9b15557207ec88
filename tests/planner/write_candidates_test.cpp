// Write-candidate planning rules (DESIGN.md §5, docs/architecture.md): one table row
// per rule and edge, each naming the positions, evidence, class and reason expected.
#include "client/write_candidates.h"

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

namespace kvpark::client {

void PrintTo(const WriteCandidate& c, std::ostream* os) {
  *os << "{" << c.position_tokens << ", evidence " << static_cast<int>(c.evidence) << ", class "
      << static_cast<int>(c.entry_class) << ", reason " << static_cast<int>(c.reason) << "}";
}

namespace {

using K = SegmentKind;
constexpr Evidence kExplicit = Evidence::ExplicitBreakpoint;
constexpr Evidence kRequested = Evidence::RequestedAutomatic;
constexpr Evidence kDefault = Evidence::DefaultAutomatic;
constexpr Evidence kStructural = Evidence::EngineStructural;
constexpr EntryClass kShared = EntryClass::Shared;
constexpr EntryClass kPrivate = EntryClass::Private;
constexpr CandidateReason kByMark = CandidateReason::Explicit;
constexpr CandidateReason kLast = CandidateReason::LastContent;
constexpr CandidateReason kFrontier = CandidateReason::SystemFrontier;

Segment seg(SegmentKind kind, uint32_t end, bool mark = false) {
  return Segment{.kind = kind, .end_token = end, .explicit_breakpoint = mark};
}

struct Row {
  std::string name;
  std::vector<Segment> segments;
  WritePlanOptions options;  // total_tokens 0 means: the last end + 5 (generation prompt)
  std::vector<WriteCandidate> expected;
  uint32_t explicit_dropped = 0;
};

WritePlanOptions opts(bool cache_options = false, bool explicit_mode = false,
                      bool system_candidate = true) {
  return WritePlanOptions{.prompt_cache_options_present = cache_options,
                          .explicit_mode = explicit_mode,
                          .automatic_system_candidate_enabled = system_candidate};
}

std::vector<Row> rows() {
  return {
      {"EmptyRequestPlansNothing", {}, opts(), {}},
      {"NoSystemSegmentOnlyLastContent",
       {seg(K::User, 40), seg(K::Assistant, 90), seg(K::User, 120)},
       opts(),
       {{120, kDefault, kPrivate, kLast}}},
      {"LastContentIsRequestedWhenCacheOptionsPresent",
       {seg(K::User, 40)},
       opts(/*cache_options=*/true),
       {{40, kRequested, kPrivate, kLast}}},
      {"SystemOf255TokensEarnsNoCandidate",
       {seg(K::System, 255), seg(K::User, 300)},
       opts(),
       {{300, kDefault, kPrivate, kLast}}},
      {"SystemOf256TokensEarnsACandidate",
       {seg(K::System, 256), seg(K::User, 300)},
       opts(),
       {{256, kStructural, kShared, kFrontier}, {300, kDefault, kPrivate, kLast}}},
      {"ToolsRenderedFirstJoinTheSystemHead",
       {seg(K::Tools, 200), seg(K::System, 400), seg(K::User, 500)},
       opts(),
       {{400, kStructural, kShared, kFrontier}, {500, kDefault, kPrivate, kLast}}},
      {"ToolsAndShortSystemReachTheMinimumTogether",
       {seg(K::Tools, 150), seg(K::System, 260), seg(K::User, 300)},
       opts(),
       {{260, kStructural, kShared, kFrontier}, {300, kDefault, kPrivate, kLast}}},
      {"ToolsRightAfterSystemJoinTheHead",
       {seg(K::System, 300), seg(K::Tools, 700), seg(K::User, 800)},
       opts(),
       {{700, kStructural, kShared, kFrontier}, {800, kDefault, kPrivate, kLast}}},
      {"ToolsAfterTheConversationAreNotPartOfTheHead",
       {seg(K::System, 300), seg(K::User, 400), seg(K::Tools, 900)},
       opts(),
       {{300, kStructural, kShared, kFrontier}, {900, kDefault, kPrivate, kLast}}},
      {"ToolsAloneFormAHead",
       {seg(K::Tools, 1000), seg(K::User, 1100)},
       opts(),
       {{1000, kStructural, kShared, kFrontier}, {1100, kDefault, kPrivate, kLast}}},
      {"DeveloperRoleIsPartOfTheHead",
       {seg(K::Developer, 512), seg(K::User, 600)},
       opts(),
       {{512, kStructural, kShared, kFrontier}, {600, kDefault, kPrivate, kLast}}},
      {"SystemSplitInSeveralMessagesIsOneRun",
       {seg(K::System, 100), seg(K::System, 200), seg(K::Developer, 300), seg(K::User, 350)},
       opts(),
       {{300, kStructural, kShared, kFrontier}, {350, kDefault, kPrivate, kLast}}},
      {"SystemAfterAUserTurnIsNotTheHead",
       {seg(K::User, 50), seg(K::System, 600), seg(K::User, 700)},
       opts(),
       {{700, kDefault, kPrivate, kLast}}},
      {"OtherSegmentEndsTheHead",
       {seg(K::Other, 10), seg(K::System, 600), seg(K::User, 700)},
       opts(),
       {{700, kDefault, kPrivate, kLast}}},
      {"ExplicitMarkAtTheFrontierLeavesNoAutomaticDuplicate",
       {seg(K::System, 400, true), seg(K::User, 500)},
       opts(),
       {{400, kExplicit, kShared, kByMark}, {500, kDefault, kPrivate, kLast}}},
      {"ExplicitMarkInsideTheHeadStillLeavesTheFrontier",
       {seg(K::Tools, 300, true), seg(K::System, 700), seg(K::User, 800)},
       opts(),
       {{300, kExplicit, kShared, kByMark},
        {700, kStructural, kShared, kFrontier},
        {800, kDefault, kPrivate, kLast}}},
      {"ExplicitMarkOnAConversationTurnIsPrivate",
       {seg(K::System, 100), seg(K::User, 200, true), seg(K::Assistant, 300)},
       opts(),
       {{200, kExplicit, kPrivate, kByMark}, {300, kDefault, kPrivate, kLast}}},
      {"ExplicitMarkOnTheLastSegmentWinsOverLastContent",
       {seg(K::User, 200), seg(K::User, 300, true)},
       opts(/*cache_options=*/true),
       {{300, kExplicit, kPrivate, kByMark}}},
      {"SixExplicitMarksKeepTheLatestFour",
       {seg(K::System, 1000, true), seg(K::User, 1100, true), seg(K::Assistant, 1200, true),
        seg(K::User, 1300, true), seg(K::Assistant, 1400, true), seg(K::User, 1500, true)},
       opts(),
       {{1200, kExplicit, kPrivate, kByMark},
        {1300, kExplicit, kPrivate, kByMark},
        {1400, kExplicit, kPrivate, kByMark},
        {1500, kExplicit, kPrivate, kByMark}},
       /*explicit_dropped=*/2},
      {"FiveExplicitMarksDropTheEarliest",
       {seg(K::User, 1100, true), seg(K::Assistant, 1200, true), seg(K::User, 1300, true),
        seg(K::Assistant, 1400, true), seg(K::User, 1500, true)},
       opts(),
       {{1200, kExplicit, kPrivate, kByMark},
        {1300, kExplicit, kPrivate, kByMark},
        {1400, kExplicit, kPrivate, kByMark},
        {1500, kExplicit, kPrivate, kByMark}},
       /*explicit_dropped=*/1},
      {"FourExplicitMarksLeaveNoSlotForAutomaticOnes",
       {seg(K::System, 1000), seg(K::User, 1100, true), seg(K::Assistant, 1200, true),
        seg(K::User, 1300, true), seg(K::Assistant, 1400, true), seg(K::User, 1500)},
       opts(),
       {{1100, kExplicit, kPrivate, kByMark},
        {1200, kExplicit, kPrivate, kByMark},
        {1300, kExplicit, kPrivate, kByMark},
        {1400, kExplicit, kPrivate, kByMark}}},
      {"ThreeExplicitMarksLeaveTheLastSlotToTheFrontier",
       {seg(K::System, 1000), seg(K::User, 1100, true), seg(K::Assistant, 1200, true),
        seg(K::User, 1300, true), seg(K::User, 1500)},
       opts(),
       {{1000, kStructural, kShared, kFrontier},
        {1100, kExplicit, kPrivate, kByMark},
        {1200, kExplicit, kPrivate, kByMark},
        {1300, kExplicit, kPrivate, kByMark}}},
      {"MarksOnTheSamePositionCountOnce",
       {seg(K::System, 100, true), seg(K::Other, 100, true), seg(K::User, 200, true),
        seg(K::User, 300, true), seg(K::User, 400, true)},
       opts(/*cache_options=*/false, /*explicit_mode=*/true),
       {{100, kExplicit, kShared, kByMark},
        {200, kExplicit, kPrivate, kByMark},
        {300, kExplicit, kPrivate, kByMark},
        {400, kExplicit, kPrivate, kByMark}}},
      {"ExplicitModeKeepsOnlyMarks",
       {seg(K::System, 1000), seg(K::User, 1100, true), seg(K::Assistant, 1200)},
       opts(/*cache_options=*/true, /*explicit_mode=*/true),
       {{1100, kExplicit, kPrivate, kByMark}}},
      {"ExplicitModeWithoutMarksPlansNothing",
       {seg(K::System, 1000), seg(K::User, 1100)},
       opts(/*cache_options=*/true, /*explicit_mode=*/true),
       {}},
      {"SwitchedOffSystemCandidate",
       {seg(K::System, 1000), seg(K::User, 1100)},
       opts(/*cache_options=*/false, /*explicit_mode=*/false, /*system_candidate=*/false),
       {{1100, kDefault, kPrivate, kLast}}},
      {"LastContentAtTheFrontierIsOneSharedCandidate",
       {seg(K::Tools, 200), seg(K::System, 600)},
       opts(),
       {{600, kStructural, kShared, kFrontier}}},
      {"RequestedLastContentAtTheFrontierOutranksStructural",
       {seg(K::System, 600)},
       opts(/*cache_options=*/true),
       {{600, kRequested, kShared, kLast}}},
      {"ShortHeadOnlyRequestIsSharedLastContent",
       {seg(K::System, 100)},
       opts(),
       {{100, kDefault, kShared, kLast}}},
      {"EmptySegmentsAtZeroPlanNothing",
       {seg(K::System, 0, true), seg(K::User, 0)},
       opts(),
       {}},
  };
}

class WriteCandidatesTable : public ::testing::TestWithParam<Row> {};

TEST_P(WriteCandidatesTable, PlansTheExpectedCandidates) {
  const Row& row = GetParam();
  WritePlanOptions options = row.options;
  options.total_tokens = row.segments.empty() ? 0 : row.segments.back().end_token + 5;
  WritePlan plan;
  plan.count = 99;  // must be overwritten
  ASSERT_EQ(plan_write_candidates(row.segments, options, &plan), Status::Ok);
  EXPECT_EQ(std::vector<WriteCandidate>(plan.view().begin(), plan.view().end()), row.expected);
  EXPECT_EQ(plan.explicit_dropped, row.explicit_dropped);
  EXPECT_LE(plan.count, write_candidates_max);
}

INSTANTIATE_TEST_SUITE_P(Rules, WriteCandidatesTable, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& row_info) { return row_info.param.name; });

TEST(WriteCandidates, RejectsDecreasingEndTokens) {
  const std::vector<Segment> segments = {seg(K::System, 300), seg(K::User, 200)};
  WritePlan plan;
  plan.count = 7;
  EXPECT_EQ(plan_write_candidates(segments, WritePlanOptions{.total_tokens = 400}, &plan),
            Status::InvalidArgument);
  EXPECT_EQ(plan.count, 7u) << "ret_plan must stay untouched on failure";
}

TEST(WriteCandidates, RejectsEndBeyondTotalTokens) {
  const std::vector<Segment> segments = {seg(K::System, 300), seg(K::User, 401)};
  WritePlan plan;
  EXPECT_EQ(plan_write_candidates(segments, WritePlanOptions{.total_tokens = 400}, &plan),
            Status::InvalidArgument);
  EXPECT_EQ(plan_write_candidates(segments, WritePlanOptions{.total_tokens = 401}, &plan),
            Status::Ok);
}

TEST(WriteCandidates, RejectsUnknownSegmentKind) {
  const std::vector<Segment> segments = {
      Segment{.kind = static_cast<SegmentKind>(segment_kind_max + 1), .end_token = 10}};
  WritePlan plan;
  EXPECT_EQ(plan_write_candidates(segments, WritePlanOptions{.total_tokens = 10}, &plan),
            Status::InvalidArgument);
}

TEST(WriteCandidates, AcceptsEqualConsecutiveEndTokens) {
  const std::vector<Segment> segments = {seg(K::System, 300), seg(K::Tools, 300),
                                         seg(K::User, 300)};
  WritePlan plan;
  ASSERT_EQ(plan_write_candidates(segments, WritePlanOptions{.total_tokens = 300}, &plan),
            Status::Ok);
  ASSERT_EQ(plan.count, 1u);
  EXPECT_EQ(plan.candidates[0].position_tokens, 300u);
}

TEST(WriteCandidates, EvidenceStrengthOrder) {
  EXPECT_GT(evidence_strength(kExplicit), evidence_strength(kRequested));
  EXPECT_GT(evidence_strength(kRequested), evidence_strength(kStructural));
  EXPECT_GT(evidence_strength(kStructural), evidence_strength(kDefault));
}

// Whatever the marks and flags, the plan stays within the cap, strictly increasing,
// and keeps the latest explicit positions.
TEST(WriteCandidates, InvariantsHoldOverManyShapes) {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int round = 0; round < 5000; ++round) {
    std::vector<Segment> segments;
    uint32_t end = 0;
    const size_t n = next() % 12;
    for (size_t i = 0; i < n; ++i) {
      end += static_cast<uint32_t>(next() % 400);
      segments.push_back(seg(static_cast<SegmentKind>(next() % (segment_kind_max + 1)), end,
                             next() % 3 == 0));
    }
    const WritePlanOptions options{.prompt_cache_options_present = next() % 2 == 0,
                                   .explicit_mode = next() % 4 == 0,
                                   .automatic_system_candidate_enabled = next() % 4 != 0,
                                   .total_tokens = end};
    WritePlan plan;
    ASSERT_EQ(plan_write_candidates(segments, options, &plan), Status::Ok);
    ASSERT_LE(plan.count, write_candidates_max);
    for (uint32_t i = 1; i < plan.count; ++i) {
      ASSERT_LT(plan.candidates[i - 1].position_tokens, plan.candidates[i].position_tokens);
    }
    // The latest marked positions (up to the cap) are all present, as explicit.
    std::vector<uint32_t> marked;
    for (size_t i = segments.size(); i-- > 0;) {
      const uint32_t p = segments[i].end_token;
      if (segments[i].explicit_breakpoint && p > 0 && (marked.empty() || marked.back() != p)) {
        marked.push_back(p);
      }
    }
    for (size_t k = 0; k < marked.size() && k < write_candidates_max; ++k) {
      bool found = false;
      for (const WriteCandidate& c : plan.view()) {
        if (c.position_tokens == marked[k]) {
          found = true;
          EXPECT_EQ(c.evidence, kExplicit);
        }
      }
      EXPECT_TRUE(found) << "marked position " << marked[k] << " missing, round " << round;
    }
    if (options.explicit_mode) {
      for (const WriteCandidate& c : plan.view()) EXPECT_EQ(c.evidence, kExplicit);
    }
  }
}

}  // namespace
}  // namespace kvpark::client
