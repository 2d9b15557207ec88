// A JSON response body as a RapidJSON document; a body that does not parse fails the
// test that asked (and yields an empty document).
#pragma once

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <string>

namespace kvpark::testing {

inline rapidjson::Document json(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  EXPECT_FALSE(d.HasParseError()) << body;
  return d;
}

}  // namespace kvpark::testing
