// A strict parser of the Prometheus text exposition format 0.0.4, for tests.
//
// Stricter than Prometheus itself on purpose: every sample's family must be
// declared by HELP and TYPE lines before its first sample, families are
// contiguous, counters end in _total, no series repeats, names and labels follow
// the grammar, and every value parses as a number.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kvpark::testing {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct PromFamily {
  std::string name;
  std::string type;  // counter, gauge, histogram, summary, untyped
  std::string help;
  std::vector<PromSample> samples;
};

struct PromDocument {
  std::map<std::string, PromFamily> families;

  // The value of the one sample `name{labels}`; false when it is absent.
  bool value(const std::string& name, const std::map<std::string, std::string>& labels,
             double& ret_value) const;
};

// Parses `text`; false with "line N: why" in ret_error.
bool parse_prometheus_text(const std::string& text, PromDocument& ret_document,
                           std::string& ret_error);

}  // namespace kvpark::testing
