// Strict Prometheus text-format parser (see prometheus_parser.h).
#include "tests/ops/prometheus_parser.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

namespace kvpark::testing {
namespace {

bool name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
}
bool name_char(char c) {
  return name_start(c) || std::isdigit(static_cast<unsigned char>(c));
}
bool label_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool label_char(char c) {
  return label_start(c) || std::isdigit(static_cast<unsigned char>(c));
}

bool valid_metric_name(const std::string& s) {
  if (s.empty() || !name_start(s[0])) return false;
  for (char c : s) {
    if (!name_char(c)) return false;
  }
  return true;
}

bool parse_value(const std::string& text, double& ret_value) {
  if (text == "+Inf") return ret_value = INFINITY, true;
  if (text == "-Inf") return ret_value = -INFINITY, true;
  if (text == "NaN") return ret_value = NAN, true;
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return false;
  ret_value = v;
  return true;
}

// The family a sample belongs to: histograms and summaries add suffixes.
std::string family_of(const std::string& sample,
                      const std::map<std::string, PromFamily>& families) {
  if (families.count(sample)) return sample;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s = suffix;
    if (sample.size() > s.size() && sample.compare(sample.size() - s.size(), s.size(), s) == 0) {
      const std::string base = sample.substr(0, sample.size() - s.size());
      auto it = families.find(base);
      if (it != families.end() &&
          (it->second.type == "histogram" || it->second.type == "summary")) {
        return base;
      }
    }
  }
  return "";
}

// Parses `{a="x",b="y"}` from text[pos]; pos ends after '}'.
bool parse_labels(const std::string& text, size_t& pos, std::map<std::string, std::string>& ret,
                  std::string& ret_error) {
  ++pos;  // '{'
  while (pos < text.size() && text[pos] != '}') {
    size_t start = pos;
    if (!label_start(text[pos])) return ret_error = "bad label name", false;
    while (pos < text.size() && label_char(text[pos])) ++pos;
    const std::string key = text.substr(start, pos - start);
    if (key.rfind("__", 0) == 0) return ret_error = "reserved label name '" + key + "'", false;
    if (pos >= text.size() || text[pos] != '=')
      return ret_error = "expected '=' after label", false;
    if (++pos >= text.size() || text[pos] != '"') return ret_error = "expected '\"'", false;
    ++pos;
    std::string value;
    for (;;) {
      if (pos >= text.size()) return ret_error = "unterminated label value", false;
      const char c = text[pos++];
      if (c == '"') break;
      if (c == '\\') {
        if (pos >= text.size()) return ret_error = "bad escape", false;
        const char e = text[pos++];
        if (e == 'n')
          value += '\n';
        else if (e == '\\' || e == '"')
          value += e;
        else
          return ret_error = "bad escape in label value", false;
      } else {
        value += c;
      }
    }
    if (!ret.emplace(key, value).second) return ret_error = "label '" + key + "' repeated", false;
    if (pos < text.size() && text[pos] == ',')
      ++pos;
    else if (pos >= text.size() || text[pos] != '}')
      return ret_error = "expected ',' or '}'", false;
  }
  if (pos >= text.size()) return ret_error = "unterminated label set", false;
  ++pos;  // '}'
  return true;
}

}  // namespace

bool PromDocument::value(const std::string& name, const std::map<std::string, std::string>& labels,
                         double& ret_value) const {
  for (const auto& [family_name, family] : families) {
    for (const PromSample& s : family.samples) {
      if (s.name == name && s.labels == labels) return ret_value = s.value, true;
    }
  }
  return false;
}

bool parse_prometheus_text(const std::string& text, PromDocument& ret_document,
                           std::string& ret_error) {
  PromDocument doc;
  std::set<std::string> series;
  std::set<std::string> finished;  // families whose samples ended (must stay contiguous)
  std::string current;             // family of the previous sample
  std::map<std::string, bool> has_help;
  size_t line_number = 0;
  size_t pos_line = 0;
  if (!text.empty() && text.back() != '\n')
    return ret_error = "text does not end in a newline", false;
  while (pos_line < text.size()) {
    const size_t end = text.find('\n', pos_line);
    const std::string line = text.substr(pos_line, end - pos_line);
    pos_line = end + 1;
    ++line_number;
    const auto fail = [&](const std::string& why) {
      ret_error = "line " + std::to_string(line_number) + ": " + why + ": '" + line + "'";
      return false;
    };
    if (line.empty()) return fail("empty line");
    if (line[0] == '#') {
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        const bool help = line[2] == 'H';
        const std::string rest = line.substr(7);
        const size_t space = rest.find(' ');
        const std::string name = rest.substr(0, space);
        const std::string arg = space == std::string::npos ? "" : rest.substr(space + 1);
        if (!valid_metric_name(name)) return fail("bad metric name");
        if (finished.count(name) ||
            (doc.families.count(name) && !doc.families[name].samples.empty())) {
          return fail("HELP/TYPE after the family's samples");
        }
        PromFamily& f = doc.families[name];
        f.name = name;
        if (help) {
          if (has_help[name]) return fail("second HELP");
          if (arg.empty()) return fail("empty HELP");
          has_help[name] = true;
          f.help = arg;
        } else {
          if (!f.type.empty()) return fail("second TYPE");
          if (arg != "counter" && arg != "gauge" && arg != "histogram" && arg != "summary" &&
              arg != "untyped") {
            return fail("unknown type");
          }
          f.type = arg;
          if (arg == "counter" &&
              (name.size() < 6 || name.compare(name.size() - 6, 6, "_total") != 0)) {
            return fail("counter name does not end in _total");
          }
          if (arg != "counter" && name.size() >= 6 &&
              name.compare(name.size() - 6, 6, "_total") == 0) {
            return fail("only counters end in _total");
          }
        }
        continue;
      }
      continue;  // other comments are allowed
    }
    size_t pos = 0;
    while (pos < line.size() && name_char(line[pos])) ++pos;
    const std::string name = line.substr(0, pos);
    if (!valid_metric_name(name)) return fail("bad sample name");
    PromSample sample;
    sample.name = name;
    if (pos < line.size() && line[pos] == '{') {
      std::string why;
      if (!parse_labels(line, pos, sample.labels, why)) return fail(why);
    }
    if (pos >= line.size() || line[pos] != ' ') return fail("expected one space before the value");
    ++pos;
    const size_t space = line.find(' ', pos);
    const std::string value_text =
        line.substr(pos, space == std::string::npos ? std::string::npos : space - pos);
    if (!parse_value(value_text, sample.value)) return fail("value does not parse");
    if (space != std::string::npos) {
      const std::string ts = line.substr(space + 1);
      if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string::npos)
        return fail("bad timestamp");
    }
    const std::string family = family_of(name, doc.families);
    if (family.empty()) return fail("sample of an undeclared family");
    PromFamily& f = doc.families[family];
    if (f.type.empty() || !has_help[family]) return fail("family lacks HELP or TYPE");
    if (f.type == "counter" && sample.value < 0) return fail("negative counter");
    if (family != current) {
      if (finished.count(family)) return fail("family's samples are not contiguous");
      if (!current.empty()) finished.insert(current);
      current = family;
    }
    std::string key = name + "{";
    for (const auto& [k, v] : sample.labels) key += k + "=\"" + v + "\",";
    if (!series.insert(key + "}").second) return fail("duplicate series");
    f.samples.push_back(std::move(sample));
  }
  for (const auto& [name, f] : doc.families) {
    if (f.type.empty() || !has_help[name])
      return ret_error = "family " + name + " lacks HELP or TYPE", false;
  }
  ret_document = std::move(doc);
  return true;
}

}  // namespace kvpark::testing
