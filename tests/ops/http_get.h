// GET a page of a kvparkd listening on 127.0.0.1:port; "" (and a test failure) when
// the request fails.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <string>

namespace kvpark::testing {

inline std::string http_get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  auto res = client.Get(path.c_str());
  EXPECT_TRUE(res) << path;
  return res ? res->body : "";
}

}  // namespace kvpark::testing
