// kvparkctl's output: sizes, durations, tables that fit the terminal, and JSON.
//
// Pure functions over strings (no bus, no sdbus types) so the formatting rules
// can be read and tested on their own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::ctl {

// 1536 -> "1.5K"; exact powers keep no decimals ("4.0G" stays "4.0G").
std::string format_bytes(uint64_t bytes);
// 3723000000 -> "1h 2min 3s"; below a second "412ms".
std::string format_duration_usec(uint64_t usec);

// A latency for status lines: "317us", "2.5ms", "250ms", "1.5s" (one decimal below ten
// of a unit, truncated).
std::string format_latency_usec(uint64_t usec);

// The largest unit only, for table cells: "412ms", "7s", "5min", "2h", "3d".
std::string format_age_usec(uint64_t usec);

// Columns of the terminal on stdout (TIOCGWINSZ); 80 when stdout is not a TTY
// or $COLUMNS does not say otherwise.
unsigned terminal_columns();
bool stdout_is_tty();

inline constexpr unsigned table_width_unlimited = ~0u;
// The width tables are cut to, as systemctl and ps do: on a TTY $COLUMNS or the
// terminal's width; into a pipe or file full width (table_width_unlimited) unless
// $COLUMNS is set; `full` (kvparkctl --full) is full width everywhere.
unsigned table_width(bool full);

struct Column {
  std::string header;
  bool right_align = false;
  bool shrinkable = false;  // gives up width (ellipsized) when the table is too wide
  unsigned shrink_min = 8;  // never narrower than this
};

// Renders a table with a header row, one space between columns, no trailing
// blanks; shrinkable columns are cut (ending in "…") until it fits `width`.
std::string render_table(const std::vector<Column>& columns,
                         const std::vector<std::vector<std::string>>& rows, unsigned width);

// A JSON string literal, escaped per RFC 8259.
std::string json_quote(const std::string& text);

}  // namespace kvpark::ctl
