// kvpark-proxy's /metrics, fetched and parsed by the project's strict Prometheus
// parser, for the end-to-end tests that read it (link tests/ops/prometheus_parser.cpp).
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tests/ops/prometheus_parser.h"
#include "tests/testing/openai_http.h"

namespace kvpark::testing {

inline PromDocument scrape(const std::string& proxy_url) {
  const HttpResult r = http_get(proxy_url, "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type").rfind("text/plain", 0), 0u) << r.header("content-type");
  PromDocument doc;
  std::string error;
  EXPECT_TRUE(parse_prometheus_text(r.body, doc, error)) << error << "\n" << r.body;
  return doc;
}

inline double metric(const PromDocument& doc, const std::string& name,
                     const std::map<std::string, std::string>& labels = {}) {
  double value = -1;
  EXPECT_TRUE(doc.value(name, labels, value)) << name;
  return value;
}

}  // namespace kvpark::testing
