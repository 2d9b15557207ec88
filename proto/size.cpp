// The size grammar (see size.h).
#include "proto/size.h"

#include <charconv>
#include <limits>
#include <utility>

namespace kvpark {
namespace {

struct Suffix {
  std::string_view short_name;
  std::string_view long_name;  // the IEC spelling
  unsigned shift;              // bytes = value << shift
};
constexpr Suffix suffixes[] = {
    {"T", "TiB", 40}, {"G", "GiB", 30}, {"M", "MiB", 20}, {"K", "KiB", 10}, {"B", "B", 0}};

}  // namespace

bool parse_size(std::string_view text, uint64_t& ret_bytes) {
  // from_chars takes no sign or space; a leading digit is still required ("K").
  if (text.empty() || text[0] < '0' || text[0] > '9') return false;
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc()) return false;  // out of range
  const std::string_view suffix(end, static_cast<size_t>(text.data() + text.size() - end));
  unsigned shift = 0;
  if (!suffix.empty()) {
    const Suffix* found = nullptr;
    for (const Suffix& s : suffixes) {
      if (suffix == s.short_name || suffix == s.long_name) found = &s;
    }
    if (found == nullptr) return false;
    shift = found->shift;
  }
  if (value > std::numeric_limits<uint64_t>::max() >> shift) return false;
  ret_bytes = value << shift;
  return true;
}

std::string format_size(uint64_t bytes) {
  if (bytes == 0) return "0";
  for (const Suffix& s : suffixes) {
    if (s.shift > 0 && bytes % (uint64_t{1} << s.shift) == 0) {
      return std::to_string(bytes >> s.shift) + std::string(s.short_name);
    }
  }
  return std::to_string(bytes);
}

}  // namespace kvpark
