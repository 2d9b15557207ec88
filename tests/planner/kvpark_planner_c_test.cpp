// The C ABI over the planner (kvpark_planner.h): the same plan as the C++ API,
// errors as kvpark_status, untouched out-parameters on failure.
#include "client/kvpark_planner.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace {

TEST(KvparkPlannerC, PlansFromSegments) {
  const kvpark_segment segments[] = {
      {KVPARK_SEGMENT_TOOLS, 200, 0},
      {KVPARK_SEGMENT_SYSTEM, 700, 0},
      {KVPARK_SEGMENT_USER, 800, 1},
      {KVPARK_SEGMENT_ASSISTANT, 900, 0},
  };
  kvpark_write_plan_options options = {};
  options.total_tokens = 905;
  kvpark_write_candidate candidates[KVPARK_WRITE_CANDIDATES_MAX];
  size_t count = 0;
  ASSERT_EQ(kvpark_plan_write_candidates(segments, 4, &options, candidates, &count), KVPARK_OK);
  ASSERT_EQ(count, 3u);
  EXPECT_EQ(candidates[0].position_tokens, 700u);
  EXPECT_EQ(candidates[0].evidence, KVPARK_EVIDENCE_ENGINE_STRUCTURAL);
  EXPECT_EQ(candidates[0].entry_class, KVPARK_CLASS_SHARED);
  EXPECT_EQ(candidates[0].reason, KVPARK_CANDIDATE_SYSTEM_FRONTIER);
  EXPECT_EQ(candidates[1].position_tokens, 800u);
  EXPECT_EQ(candidates[1].evidence, KVPARK_EVIDENCE_EXPLICIT_BREAKPOINT);
  EXPECT_EQ(candidates[1].entry_class, KVPARK_CLASS_PRIVATE);
  EXPECT_EQ(candidates[2].position_tokens, 900u);
  EXPECT_EQ(candidates[2].evidence, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC);

  options.automatic_system_candidate_disabled = 1;
  ASSERT_EQ(kvpark_plan_write_candidates(segments, 4, &options, candidates, &count), KVPARK_OK);
  EXPECT_EQ(count, 2u);
}

TEST(KvparkPlannerC, RejectsBadSegments) {
  const kvpark_segment decreasing[] = {{KVPARK_SEGMENT_SYSTEM, 300, 0},
                                       {KVPARK_SEGMENT_USER, 200, 0}};
  kvpark_write_plan_options options = {};
  options.total_tokens = 300;
  kvpark_write_candidate candidates[KVPARK_WRITE_CANDIDATES_MAX];
  size_t count = 42;
  EXPECT_EQ(kvpark_plan_write_candidates(decreasing, 2, &options, candidates, &count),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(count, 42u);
  kvpark_segment unknown[] = {{KVPARK_SEGMENT_USER, 10, 0}};
  const int bad_kind = 99;  // what a C caller may pass; C++ cannot name it without UB
  static_assert(sizeof unknown[0].kind == sizeof bad_kind);
  std::memcpy(&unknown[0].kind, &bad_kind, sizeof bad_kind);
  EXPECT_EQ(kvpark_plan_write_candidates(unknown, 1, &options, candidates, &count),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(kvpark_plan_write_candidates(nullptr, 0, &options, candidates, &count), KVPARK_OK);
  EXPECT_EQ(count, 0u);
}

TEST(KvparkPlannerC, ParsesSegmentsAndPlans) {
  const std::string body = R"({"messages": [
      {"role": "system", "content": "s"},
      {"role": "user", "content": [{"type": "text", "text": "u", "cache_control": {"type": "ephemeral"}}]},
      {"role": "assistant", "content": "a"}],
    "tools": [{"type": "function"}],
    "prompt_cache_options": {}})";
  kvpark_request* request = nullptr;
  char error[128] = "";
  ASSERT_EQ(kvpark_request_parse(body.data(), body.size(), KVPARK_REQUEST_DETECT, &request,
                                 error, sizeof error),
            KVPARK_OK)
      << error;
  ASSERT_NE(request, nullptr);
  ASSERT_EQ(kvpark_request_message_count(request), 3u);
  EXPECT_EQ(kvpark_request_message_kind(request, 0), KVPARK_SEGMENT_SYSTEM);
  EXPECT_EQ(kvpark_request_message_kind(request, 2), KVPARK_SEGMENT_ASSISTANT);
  EXPECT_EQ(kvpark_request_message_breakpoint(request, 1), 1);
  EXPECT_EQ(kvpark_request_tools_present(request), 1);
  EXPECT_EQ(kvpark_request_prompt_cache_options_present(request), 1);
  EXPECT_EQ(kvpark_request_explicit_mode(request), 0);

  const uint32_t ends[] = {400, 500, 600};
  kvpark_segment segments[4];
  size_t n_segments = 0;
  EXPECT_EQ(kvpark_request_segments(request, ends, 3, 300, KVPARK_TOOLS_BEFORE_MESSAGES,
                                    segments, 3, &n_segments),
            KVPARK_INVALID_ARGUMENT)
      << "room for 3 segments is short of 4";
  ASSERT_EQ(kvpark_request_segments(request, ends, 3, 300, KVPARK_TOOLS_BEFORE_MESSAGES,
                                    segments, 4, &n_segments),
            KVPARK_OK);
  ASSERT_EQ(n_segments, 4u);
  EXPECT_EQ(segments[0].kind, KVPARK_SEGMENT_TOOLS);

  kvpark_write_plan_options options;
  kvpark_request_write_plan_options(request, 610, 0, &options);
  kvpark_write_candidate candidates[KVPARK_WRITE_CANDIDATES_MAX];
  size_t count = 0;
  ASSERT_EQ(kvpark_plan_write_candidates(segments, n_segments, &options, candidates, &count),
            KVPARK_OK);
  ASSERT_EQ(count, 3u);
  EXPECT_EQ(candidates[0].position_tokens, 400u);  // tools + system head
  EXPECT_EQ(candidates[1].position_tokens, 500u);  // the cache_control mark
  EXPECT_EQ(candidates[1].evidence, KVPARK_EVIDENCE_EXPLICIT_BREAKPOINT);
  EXPECT_EQ(candidates[2].position_tokens, 600u);
  EXPECT_EQ(candidates[2].evidence, KVPARK_EVIDENCE_REQUESTED_AUTOMATIC);
  kvpark_request_free(request);
  kvpark_request_free(nullptr);
}

TEST(KvparkPlannerC, ParseErrorNamesThePathAndTruncates) {
  const std::string body = R"({"messages": [{"role": "user", "content": 7}]})";
  kvpark_request* request = nullptr;
  char error[128];
  EXPECT_EQ(kvpark_request_parse(body.data(), body.size(), KVPARK_REQUEST_DETECT, &request,
                                 error, sizeof error),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(request, nullptr);
  EXPECT_STREQ(error, "messages[0].content: expected a string or an array");
  char small[9];
  EXPECT_EQ(kvpark_request_parse(body.data(), body.size(), KVPARK_REQUEST_DETECT, &request,
                                 small, sizeof small),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_STREQ(small, "messages");
  EXPECT_EQ(kvpark_request_parse("{", 1, KVPARK_REQUEST_DETECT, &request, nullptr, 0),
            KVPARK_INVALID_ARGUMENT);
  EXPECT_EQ(request, nullptr);
}

}  // namespace
