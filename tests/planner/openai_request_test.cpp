// OpenAI request parsing: valid Chat Completions and Responses bodies, every
// malformed shape with the path its error names, truncated bodies, and the join
// with renderer offsets into planner segments.
#include "client/openai_request.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvpark::client {
namespace {

using K = SegmentKind;

const char* const kChatBody = R"({
  "model": "gpt-4.1",
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "developer", "content": [{"type": "text", "text": "Rules.",
                                       "prompt_cache_breakpoint": {}}]},
    {"role": "user", "content": [{"type": "text", "text": "Hi"},
                                 {"type": "image_url", "image_url": {"url": "data:x"}}]},
    {"role": "assistant", "content": null,
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
    {"role": "user", "content": "thanks", "prompt_cache_breakpoint": {"ttl": "1h"}}
  ],
  "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
  "prompt_cache_options": {"mode": "automatic"},
  "prompt_cache_key": "tenant-7"
})";

const char* const kResponsesBody = R"({
  "model": "gpt-5",
  "instructions": "Be helpful.",
  "input": [
    {"role": "developer", "content": "dev rules"},
    {"type": "message", "role": "user",
     "content": [{"type": "input_text", "text": "look", "cache_control": {"type": "ephemeral"}}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "done"},
    {"type": "reasoning", "summary": []},
    {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    {"type": "item_reference", "id": "msg_1"}
  ],
  "tools": [{"type": "function", "name": "f", "parameters": {},
             "cache_control": {"type": "ephemeral"}}],
  "prompt_cache_options": {"mode": "explicit"}
})";

ParsedRequest parse_ok(std::string_view body, RequestApi api = RequestApi::Detect) {
  ParsedRequest request;
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(body, api, &request, &error), RequestParseStatus::Ok)
      << error.message;
  return request;
}

TEST(OpenAiRequest, ParsesChatCompletions) {
  const ParsedRequest r = parse_ok(kChatBody);
  EXPECT_EQ(r.api, RequestApi::ChatCompletions);
  EXPECT_EQ(r.model, "gpt-4.1");
  ASSERT_EQ(r.messages.size(), 6u);
  const std::vector<MessageRole> roles = {MessageRole::System, MessageRole::Developer,
                                          MessageRole::User,   MessageRole::Assistant,
                                          MessageRole::Tool,   MessageRole::User};
  const std::vector<bool> marks = {false, true, false, false, false, true};
  for (size_t i = 0; i < roles.size(); ++i) {
    EXPECT_EQ(r.messages[i].role, roles[i]) << i;
    EXPECT_EQ(r.messages[i].breakpoint, marks[i]) << i;
  }
  ASSERT_EQ(r.messages[0].parts.size(), 1u);
  EXPECT_EQ(r.messages[0].parts[0].text, "You are terse.");
  EXPECT_TRUE(r.messages[1].parts[0].breakpoint) << "the mark is on the part";
  ASSERT_EQ(r.messages[2].parts.size(), 2u);
  EXPECT_EQ(r.messages[2].parts[1].type, "image_url");
  EXPECT_TRUE(r.messages[3].parts.empty());
  EXPECT_TRUE(r.tools_present);
  EXPECT_FALSE(r.tools_breakpoint);
  EXPECT_TRUE(r.prompt_cache_options_present);
  EXPECT_FALSE(r.explicit_mode);
  EXPECT_EQ(r.prompt_cache_key, "tenant-7");
}

TEST(OpenAiRequest, ParsesResponses) {
  const ParsedRequest r = parse_ok(kResponsesBody);
  EXPECT_EQ(r.api, RequestApi::Responses);
  ASSERT_EQ(r.messages.size(), 8u);
  const std::vector<MessageRole> roles = {
      MessageRole::System,    MessageRole::Developer, MessageRole::User,
      MessageRole::Assistant, MessageRole::Tool,      MessageRole::Assistant,
      MessageRole::Assistant, MessageRole::Other};
  for (size_t i = 0; i < roles.size(); ++i) EXPECT_EQ(r.messages[i].role, roles[i]) << i;
  EXPECT_EQ(r.messages[0].item_type, "instructions");
  ASSERT_EQ(r.messages[0].parts.size(), 1u);
  EXPECT_EQ(r.messages[0].parts[0].text, "Be helpful.");
  EXPECT_TRUE(r.messages[2].breakpoint) << "cache_control on a part is an explicit mark";
  EXPECT_EQ(r.messages[4].item_type, "function_call_output");
  ASSERT_EQ(r.messages[4].parts.size(), 1u);
  EXPECT_EQ(r.messages[4].parts[0].text, "done");
  EXPECT_TRUE(r.tools_present);
  EXPECT_TRUE(r.tools_breakpoint);
  EXPECT_TRUE(r.prompt_cache_options_present);
  EXPECT_TRUE(r.explicit_mode);
}

TEST(OpenAiRequest, ParsesResponsesStringInput) {
  const ParsedRequest r = parse_ok(R"({"input": "hello"})");
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, MessageRole::User);
  EXPECT_EQ(r.messages[0].parts[0].text, "hello");
  EXPECT_FALSE(r.tools_present);
  EXPECT_FALSE(r.prompt_cache_options_present);
}

TEST(OpenAiRequest, EmptyToolsArrayIsNoTools) {
  EXPECT_FALSE(parse_ok(R"({"messages": [], "tools": []})").tools_present);
  EXPECT_TRUE(parse_ok(R"({"messages": [], "functions": [{"name": "f"}]})").tools_present);
}

TEST(OpenAiRequest, BooleanBreakpoint) {
  const ParsedRequest r = parse_ok(
      R"({"messages": [{"role": "user", "content": "a", "prompt_cache_breakpoint": true},
                       {"role": "user", "content": "b", "prompt_cache_breakpoint": false},
                       {"role": "user", "content": "c", "prompt_cache_breakpoint": null}]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_TRUE(r.messages[0].breakpoint);
  EXPECT_FALSE(r.messages[1].breakpoint);
  EXPECT_FALSE(r.messages[2].breakpoint);
}

TEST(OpenAiRequest, ExplicitApiOverridesDetection) {
  ParsedRequest request;
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(R"({"input": "x"})", RequestApi::ChatCompletions, &request,
                                 &error),
            RequestParseStatus::InvalidShape);
  EXPECT_EQ(error.path, "messages");
}

struct BadBody {
  std::string name;
  std::string body;
  RequestParseStatus status;
  std::string path;
};

std::vector<BadBody> bad_bodies() {
  using S = RequestParseStatus;
  return {
      {"NotJson", "{\"messages\": [", S::NotJson, ""},
      {"EmptyBody", "", S::NotJson, ""},
      {"TrailingGarbage", R"({"messages": []} x)", S::NotJson, ""},
      {"NotAnObject", "[1, 2]", S::InvalidShape, ""},
      {"NeitherMessagesNorInput", R"({"model": "m"})", S::InvalidShape, ""},
      {"MessagesNotAnArray", R"({"messages": {"role": "user"}})", S::InvalidShape, "messages"},
      {"MessageNotAnObject", R"({"messages": ["hi"]})", S::InvalidShape, "messages[0]"},
      {"MessageWithoutRole", R"({"messages": [{"content": "hi"}]})", S::InvalidShape,
       "messages[0].role"},
      {"RoleNotAString", R"({"messages": [{"role": 3, "content": "hi"}]})", S::InvalidShape,
       "messages[0].role"},
      {"UnknownRole",
       R"({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]})",
       S::InvalidShape, "messages[1].role"},
      {"ContentOfAWrongType",
       R"({"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
                        {"role": "user", "content": 7}]})",
       S::InvalidShape, "messages[2].content"},
      {"UserContentMissing", R"({"messages": [{"role": "user"}]})", S::InvalidShape,
       "messages[0].content"},
      {"UserContentNull", R"({"messages": [{"role": "user", "content": null}]})",
       S::InvalidShape, "messages[0].content"},
      {"PartNotAnObject", R"({"messages": [{"role": "user", "content": ["x"]}]})",
       S::InvalidShape, "messages[0].content[0]"},
      {"PartWithoutType", R"({"messages": [{"role": "user", "content": [{"text": "x"}]}]})",
       S::InvalidShape, "messages[0].content[0].type"},
      {"TextPartWithoutText", R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})",
       S::InvalidShape, "messages[0].content[0].text"},
      {"BreakpointOnAPartOfAWrongType",
       R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
           {"type": "text", "text": "y", "prompt_cache_breakpoint": "yes"}]}]})",
       S::InvalidShape, "messages[0].content[1].prompt_cache_breakpoint"},
      {"CacheControlNotAnObject",
       R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x",
           "cache_control": "ephemeral"}]}]})",
       S::InvalidShape, "messages[0].content[0].cache_control"},
      {"BreakpointOnAMessageOfAWrongType",
       R"({"messages": [{"role": "user", "content": "x", "prompt_cache_breakpoint": 1}]})",
       S::InvalidShape, "messages[0].prompt_cache_breakpoint"},
      {"ToolsNotAnArray", R"({"messages": [], "tools": {}})", S::InvalidShape, "tools"},
      {"ToolNotAnObject", R"({"messages": [], "tools": [1]})", S::InvalidShape, "tools[0]"},
      {"ModelNotAString", R"({"model": 4, "messages": []})", S::InvalidShape, "model"},
      {"CacheOptionsNotAnObject", R"({"messages": [], "prompt_cache_options": true})",
       S::InvalidShape, "prompt_cache_options"},
      {"UnknownCacheMode", R"({"messages": [], "prompt_cache_options": {"mode": "eager"}})",
       S::InvalidShape, "prompt_cache_options.mode"},
      {"InputOfAWrongType", R"({"input": 5})", S::InvalidShape, "input"},
      {"InputItemWithoutRoleOrType", R"({"input": [{"content": "x"}]})", S::InvalidShape,
       "input[0]"},
      {"InputItemUnknownRole", R"({"input": [{"role": "narrator", "content": "x"}]})",
       S::InvalidShape, "input[0].role"},
      {"InstructionsNotAString", R"({"instructions": [], "input": "x"})", S::InvalidShape,
       "instructions"},
      {"FunctionOutputOfAWrongType",
       R"({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]})",
       S::InvalidShape, "input[0].output"},
  };
}

class OpenAiRequestBad : public ::testing::TestWithParam<BadBody> {};

TEST_P(OpenAiRequestBad, FailsNamingThePath) {
  const BadBody& bad = GetParam();
  ParsedRequest request;
  request.model = "untouched";
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(bad.body, RequestApi::Detect, &request, &error), bad.status)
      << error.message;
  EXPECT_EQ(error.status, bad.status);
  EXPECT_EQ(error.path, bad.path) << error.message;
  const std::string prefix = (bad.path.empty() ? std::string("request") : bad.path) + ": ";
  EXPECT_EQ(error.message.rfind(prefix, 0), 0u) << error.message;
  EXPECT_GT(error.message.size(), prefix.size());
  EXPECT_EQ(request.model, "untouched") << "ret_request must stay untouched on failure";
}

INSTANTIATE_TEST_SUITE_P(Shapes, OpenAiRequestBad, ::testing::ValuesIn(bad_bodies()),
                         [](const ::testing::TestParamInfo<BadBody>& bad_info) {
                           return bad_info.param.name;
                         });

TEST(OpenAiRequest, ErrorMessageReadsLikeTheContract) {
  ParsedRequest request;
  RequestParseError error;
  parse_openai_request(
      R"({"messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
                       {"role": "user", "content": 7}]})",
      RequestApi::Detect, &request, &error);
  EXPECT_EQ(error.message, "messages[2].content: expected a string or an array");
}

TEST(OpenAiRequest, RejectsTooManyMessages) {
  std::string body = R"({"messages": [)";
  for (size_t i = 0; i <= request_messages_max; ++i) {
    body += i == 0 ? "" : ",";
    body += R"({"role":"user","content":"x"})";
  }
  body += "]}";
  ParsedRequest request;
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(body, RequestApi::Detect, &request, &error),
            RequestParseStatus::LimitExceeded);
  EXPECT_EQ(error.path, "messages");
}

TEST(OpenAiRequest, AcceptsExactlyTheMessageLimit) {
  std::string body = R"({"messages": [)";
  for (size_t i = 0; i < request_messages_max; ++i) {
    body += i == 0 ? "" : ",";
    body += R"({"role":"user","content":"x"})";
  }
  body += "]}";
  EXPECT_EQ(parse_ok(body).messages.size(), request_messages_max);
}

std::string body_with_parts(size_t parts) {
  std::string body = R"({"messages": [{"role": "user", "content": [)";
  for (size_t i = 0; i < parts; ++i) {
    body += i == 0 ? "" : ",";
    body += R"({"type":"text","text":"x"})";
  }
  return body + "]}]}";
}

TEST(OpenAiRequest, PartLimitAtNAndNPlusOne) {
  EXPECT_EQ(parse_ok(body_with_parts(message_parts_max)).messages[0].parts.size(),
            message_parts_max);
  ParsedRequest request;
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(body_with_parts(message_parts_max + 1), RequestApi::Detect,
                                 &request, &error),
            RequestParseStatus::LimitExceeded);
  EXPECT_EQ(error.path, "messages[0].content");
}

TEST(OpenAiRequest, DeepNestingIsAnErrorNotACrash) {
  // Recursive parsing would overflow the stack here; the iterative parser must not.
  const size_t depth = 200'000;
  std::string body = R"({"messages": [{"role": "user", "content": "x", "extra": )";
  body += std::string(depth, '[');
  ParsedRequest request;
  RequestParseError error;
  EXPECT_EQ(parse_openai_request(body, RequestApi::Detect, &request, &error),
            RequestParseStatus::NotJson);
  body += std::string(depth, ']') + "}]}";
  EXPECT_EQ(parse_openai_request(body, RequestApi::Detect, &request, &error),
            RequestParseStatus::Ok);
}

// Every prefix of a valid body gives an error or a valid parse, never a crash; the
// full body parses.
TEST(OpenAiRequest, TruncatedBodiesNeverCrash) {
  for (const char* full : {kChatBody, kResponsesBody}) {
    const std::string body = full;
    size_t errors = 0;
    for (size_t n = 0; n < body.size(); ++n) {
      ParsedRequest request;
      RequestParseError error;
      const RequestParseStatus status =
          parse_openai_request(std::string_view(body).substr(0, n), RequestApi::Detect,
                               &request, &error);
      if (status != RequestParseStatus::Ok) {
        ++errors;
        EXPECT_FALSE(error.message.empty()) << "prefix " << n;
      }
    }
    EXPECT_EQ(errors, body.size()) << "no strict prefix of an object is valid JSON";
    ParsedRequest request;
    EXPECT_EQ(parse_openai_request(body, RequestApi::Detect, &request, nullptr),
              RequestParseStatus::Ok);
  }
}

// Flipping bytes must not crash either (a cheap mutation fuzz with a fixed seed).
TEST(OpenAiRequest, MutatedBodiesNeverCrash) {
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  const std::string alphabet = "{}[]\":,0tfn \\x";
  for (const char* full : {kChatBody, kResponsesBody}) {
    for (int round = 0; round < 3000; ++round) {
      std::string body = full;
      for (int k = 0; k < 3; ++k) body[next() % body.size()] = alphabet[next() % alphabet.size()];
      ParsedRequest request;
      RequestParseError error;
      const RequestParseStatus status =
          parse_openai_request(body, RequestApi::Detect, &request, &error);
      if (status != RequestParseStatus::Ok) {
        EXPECT_FALSE(error.message.empty());
      }
    }
  }
}

TEST(OpenAiRequestSegments, ToolsBeforeMessages) {
  const ParsedRequest r = parse_ok(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u",
          "prompt_cache_breakpoint": {}}], "tools": [{"type": "function"}]})");
  const std::vector<uint32_t> ends = {500, 600};
  std::vector<Segment> segments;
  ASSERT_EQ(segments_from_request(r,
                                  RenderedOffsets{.message_end_tokens = ends,
                                                  .tools_end_token = 300,
                                                  .tools_placement = ToolsPlacement::BeforeMessages},
                                  &segments),
            Status::Ok);
  ASSERT_EQ(segments.size(), 3u);
  EXPECT_EQ(segments[0].kind, K::Tools);
  EXPECT_EQ(segments[0].end_token, 300u);
  EXPECT_EQ(segments[1].kind, K::System);
  EXPECT_EQ(segments[2].kind, K::User);
  EXPECT_TRUE(segments[2].explicit_breakpoint);
}

TEST(OpenAiRequestSegments, ToolsAfterLeadingSystemRun) {
  const ParsedRequest r = parse_ok(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
          {"role": "user", "content": "u"}], "tools": [{"type": "function"}]})");
  const std::vector<uint32_t> ends = {100, 200, 900};
  std::vector<Segment> segments;
  ASSERT_EQ(segments_from_request(
                r,
                RenderedOffsets{.message_end_tokens = ends,
                                .tools_end_token = 800,
                                .tools_placement = ToolsPlacement::AfterLeadingSystem},
                &segments),
            Status::Ok);
  ASSERT_EQ(segments.size(), 4u);
  EXPECT_EQ(segments[2].kind, K::Tools);
  // Planned end to end: the head is system + developer + tools.
  WritePlan plan;
  ASSERT_EQ(plan_write_candidates(segments, write_plan_options(r, 905, true), &plan),
            Status::Ok);
  ASSERT_EQ(plan.count, 2u);
  EXPECT_EQ(plan.candidates[0].position_tokens, 800u);
  EXPECT_EQ(plan.candidates[0].reason, CandidateReason::SystemFrontier);
  EXPECT_EQ(plan.candidates[1].position_tokens, 900u);
}

TEST(OpenAiRequestSegments, ToolsNotRenderedOrAbsent) {
  const ParsedRequest r = parse_ok(
      R"({"messages": [{"role": "user", "content": "u"}], "tools": [{"type": "function"}]})");
  const std::vector<uint32_t> ends = {10};
  std::vector<Segment> segments;
  ASSERT_EQ(segments_from_request(r,
                                  RenderedOffsets{.message_end_tokens = ends,
                                                  .tools_placement = ToolsPlacement::NotRendered},
                                  &segments),
            Status::Ok);
  EXPECT_EQ(segments.size(), 1u);
  const ParsedRequest no_tools = parse_ok(R"({"messages": [{"role": "user", "content": "u"}]})");
  ASSERT_EQ(segments_from_request(no_tools, RenderedOffsets{.message_end_tokens = ends}, &segments),
            Status::Ok);
  EXPECT_EQ(segments.size(), 1u);
}

TEST(OpenAiRequestSegments, RejectsWrongCountAndDecreasingOffsets) {
  const ParsedRequest r = parse_ok(
      R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
          "tools": [{"type": "function"}]})");
  std::vector<Segment> segments = {Segment{}};
  const std::vector<uint32_t> one = {10};
  EXPECT_EQ(segments_from_request(r, RenderedOffsets{.message_end_tokens = one}, &segments),
            Status::InvalidArgument);
  const std::vector<uint32_t> ends = {100, 200};
  // Tools rendered first cannot end after the system message.
  EXPECT_EQ(segments_from_request(r,
                                  RenderedOffsets{.message_end_tokens = ends,
                                                  .tools_end_token = 150,
                                                  .tools_placement = ToolsPlacement::BeforeMessages},
                                  &segments),
            Status::InvalidArgument);
  const std::vector<uint32_t> decreasing = {200, 100};
  EXPECT_EQ(segments_from_request(r,
                                  RenderedOffsets{.message_end_tokens = decreasing,
                                                  .tools_placement = ToolsPlacement::NotRendered},
                                  &segments),
            Status::InvalidArgument);
  EXPECT_EQ(segments.size(), 1u) << "ret_segments must stay untouched on failure";
}

}  // namespace
}  // namespace kvpark::client
