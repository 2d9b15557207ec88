// proxy/json.h: the nesting limit the proxy reads JSON under, counted without
// recursion.
#include "proxy/json.h"

#include <gtest/gtest.h>

#include <string>

namespace kvpark::proxy {
namespace {

std::string nested(size_t depth) {
  return std::string(depth, '[') + std::string(depth, ']');
}

TEST(JsonDepth, CountsArraysAndObjectsToTheLimitAndRefusesOneMore) {
  EXPECT_TRUE(json_depth_within("", 0));
  EXPECT_TRUE(json_depth_within("1", 0));
  EXPECT_FALSE(json_depth_within("[]", 0));
  EXPECT_TRUE(json_depth_within("[[1], {\"a\": [2]}]", 3));
  EXPECT_FALSE(json_depth_within("[[1], {\"a\": [2]}]", 2));
  EXPECT_TRUE(json_depth_within(nested(json_depth_max), json_depth_max));
  EXPECT_FALSE(json_depth_within(nested(json_depth_max + 1), json_depth_max));
}

TEST(JsonDepth, BracketsInStringsAndEscapedQuotesDoNotCount) {
  EXPECT_TRUE(json_depth_within("{\"a\": \"[[[[{{{{\"}", 1));
  EXPECT_TRUE(json_depth_within(R"({"a": "\"[[[", "b": "\\"})", 1));
  EXPECT_FALSE(json_depth_within(R"({"a": "\\", "b": [[1]]})", 2));  // the string ended
  EXPECT_TRUE(json_depth_within(R"(["\u005b\u005b"])", 1));
}

TEST(ParseJson, RefusesTooDeepBeforeParsingAndReportsBothFailures) {
  rapidjson::Document doc;
  EXPECT_EQ(parse_json(nested(json_depth_max), doc), JsonStatus::ok);
  EXPECT_TRUE(doc.IsArray());
  // Far past any thread's stack for a recursive parser; refused, not parsed.
  EXPECT_EQ(parse_json(std::string(200'000, '['), doc), JsonStatus::too_deep);
  EXPECT_EQ(parse_json(nested(json_depth_max + 1), doc), JsonStatus::too_deep);
  EXPECT_NE(json_error_string(JsonStatus::too_deep, doc).find(std::to_string(json_depth_max)),
            std::string::npos);
  EXPECT_EQ(parse_json("{\"a\": ", doc), JsonStatus::invalid);
  EXPECT_NE(json_error_string(JsonStatus::invalid, doc).find("at byte"), std::string::npos);
  EXPECT_EQ(json_error_string(JsonStatus::ok, doc), "");
}

}  // namespace
}  // namespace kvpark::proxy
