// Sizes as people write them: the one grammar of kvparkd's flags, kvparkd.conf and
// kvparkctl set-limit (kvparkd(8), kvparkd.conf(5), kvparkctl(1)).
//
// A size is decimal digits, optionally followed by one binary suffix: B (bytes),
// K, M, G or T, also written KiB, MiB, GiB, TiB. Nothing else: no spaces, sign,
// fraction, lower case or SI units ("1GB"), and the value must fit 64 bits.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvpark {

// "64M", "1GiB", "4096" -> bytes; false on anything else, ret_bytes untouched.
bool parse_size(std::string_view text, uint64_t& ret_bytes);

// The shortest exact form with the largest suffix that divides it, which
// parse_size reads back: 0 -> "0", 4096 -> "4K", 1536 MiB -> "1536M", 4097 -> "4097".
std::string format_size(uint64_t bytes);

}  // namespace kvpark
