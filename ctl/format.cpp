// kvparkctl output formatting (see format.h).
#include "ctl/format.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kvpark::ctl {
namespace {

constexpr const char* ellipsis = "…";  // three bytes, one column
constexpr unsigned column_gap = 1;  // as systemctl list-units

// Display columns of UTF-8 text: count every byte that does not continue a sequence.
size_t display_width(const std::string& text) {
  return static_cast<size_t>(std::count_if(text.begin(), text.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

std::string ellipsize(const std::string& text, size_t width) {
  if (display_width(text) <= width) return text;
  if (width == 0) return "";
  return text.substr(0, width - 1) + ellipsis;  // cells hold ASCII before the cut
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"K", "M", "G", "T", "P", "E"};
  if (bytes < 1024) return std::to_string(bytes) + "B";
  double value = static_cast<double>(bytes);
  size_t unit = 0;
  value /= 1024;
  while (value >= 1024 && unit + 1 < std::size(units)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  snprintf(text, sizeof text, "%.1f%s", value, units[unit]);
  return text;
}

std::string format_duration_usec(uint64_t usec) {
  if (usec < 1'000'000) return std::to_string(usec / 1000) + "ms";
  uint64_t s = usec / 1'000'000;
  const uint64_t d = s / 86400, h = s / 3600 % 24, m = s / 60 % 60;
  s %= 60;
  std::string out;
  if (d) out += std::to_string(d) + "d ";
  if (d || h) out += std::to_string(h) + "h ";
  if (d || h || m) out += std::to_string(m) + "min ";
  return out + std::to_string(s) + "s";
}

std::string format_latency_usec(uint64_t usec) {
  if (usec < 1'000) return std::to_string(usec) + "us";
  const uint64_t unit = usec < 1'000'000 ? 1'000 : 1'000'000;
  const char* name = unit == 1'000 ? "ms" : "s";
  if (usec >= 10 * unit) return std::to_string(usec / unit) + name;
  return std::to_string(usec / unit) + "." + std::to_string(usec % unit * 10 / unit) + name;
}

std::string format_age_usec(uint64_t usec) {
  if (usec < 1'000'000) return std::to_string(usec / 1000) + "ms";
  const uint64_t s = usec / 1'000'000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "min";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

bool stdout_is_tty() { return isatty(STDOUT_FILENO) == 1; }

unsigned terminal_columns() {
  if (const char* env = getenv("COLUMNS"); env != nullptr && atoi(env) > 0) {
    return static_cast<unsigned>(atoi(env));
  }
  winsize ws{};
  if (stdout_is_tty() && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    return ws.ws_col;
  }
  return 80;
}

unsigned table_width(bool full) {
  if (full) return table_width_unlimited;
  if (const char* env = getenv("COLUMNS"); env != nullptr && atoi(env) > 0) {
    return static_cast<unsigned>(atoi(env));
  }
  return stdout_is_tty() ? terminal_columns() : table_width_unlimited;
}

std::string render_table(const std::vector<Column>& columns,
                         const std::vector<std::vector<std::string>>& rows, unsigned width) {
  std::vector<size_t> widths(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    widths[c] = display_width(columns[c].header);
    for (const auto& row : rows) widths[c] = std::max(widths[c], display_width(row[c]));
  }
  auto total = [&] {
    size_t sum = 0;
    for (size_t w : widths) sum += w;
    return sum + column_gap * (widths.empty() ? 0 : widths.size() - 1);
  };
  // Take one column at a time from the widest shrinkable column until it fits.
  while (total() > width) {
    size_t widest = columns.size();
    for (size_t c = 0; c < columns.size(); ++c) {
      if (!columns[c].shrinkable || widths[c] <= columns[c].shrink_min) continue;
      if (widest == columns.size() || widths[c] > widths[widest]) widest = c;
    }
    if (widest == columns.size()) break;  // nothing left to give: let it wrap
    --widths[widest];
  }
  std::string out;
  auto emit_row = [&](auto cell_of) {
    std::string line;
    for (size_t c = 0; c < columns.size(); ++c) {
      std::string cell = ellipsize(cell_of(c), widths[c]);
      const std::string pad(widths[c] - display_width(cell), ' ');
      if (c > 0) line += std::string(column_gap, ' ');
      line += columns[c].right_align ? pad + cell : cell + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit_row([&](size_t c) { return columns[c].header; });
  for (const auto& row : rows) emit_row([&](size_t c) { return row[c]; });
  return out;
}

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          snprintf(escaped, sizeof escaped, "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

}  // namespace kvpark::ctl
