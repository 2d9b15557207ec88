// kvparkd.conf: the configuration file and the key table it shares with the flags.
//
// Layers, lowest first: embedded defaults, the file, the command line. Every key is
// also a flag (`arena_size` is `--arena-size`) and is parsed by the same code, so a
// value means the same wherever it is written. The format (kvparkd.conf(5)) is one
// `key = value` per line; `#` or `;` starts a comment line; blank lines are ignored;
// a key given twice is an error. Errors name their place: "path:line: message" for
// the file, "--flag: message" for the command line.
//
// Last come the runtime overrides: what `kvparkctl set-limit` changed, kept in
// `<state_dir>/runtime-overrides.conf` (same format, only the keys set-limit sets) so
// a restart keeps it. A damaged overrides file, or one that no longer fits the other
// values, is ignored with a warning: the daemon still starts.
//
// --print-config writes the effective values in the file's own format (derived ones
// such as reservation_max and arena_low_water computed by finish_options, the code
// the daemon runs with); its output read back as a file gives the same options.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/control.h"
#include "daemon/options.h"
#include "proto/status.h"

namespace kvpark::daemon {

class Park;

// Embedded defaults (reads $STATE_DIRECTORY, $WATCHDOG_USEC, $NOTIFY_SOCKET).
DaemonOptions default_options();

// Sets one key from its text form; false with a message (no location) otherwise.
bool set_config_value(DaemonOptions& o, std::string_view key, std::string_view value,
                      std::string& ret_error);

// Applies a file's text over `o`; false with "path:line: message" in ret_error.
bool apply_config_text(std::string_view text, const std::string& path, DaemonOptions& o,
                       std::string& ret_error);

// Reads `path` and applies it. A missing file is fine unless `required`.
bool apply_config_file(const std::string& path, bool required, DaemonOptions& o,
                       std::string& ret_error);

// Fills values derived from others and checks how values relate.
bool finish_options(DaemonOptions& o, std::string& ret_error);

// The overrides file's name in the state directory.
inline constexpr const char* runtime_overrides_file_name = "runtime-overrides.conf";
// `<state_dir>/runtime-overrides.conf`; empty when state_dir is off.
std::string runtime_overrides_path(const DaemonOptions& o);

// Finishes `o` (finish_options) with the overrides file applied over it. False with
// the message when the layers below are wrong; an overrides file that cannot be used
// leaves `o` without it and says why in ret_warning (otherwise emptied).
bool finish_with_overrides(DaemonOptions& o, std::string& ret_error, std::string& ret_warning);

// The config key a set-limit name changes ("arena-low-water" -> "arena_low_water");
// null for a name set-limit does not know.
const char* limit_config_key(std::string_view limit_name);

// A set-limit took effect (loop thread): updates `current` to match, keeps the
// change in the overrides file when there is a state directory, and logs who changed
// what from what to what, and where it is kept.
void keep_limit_change(DaemonOptions& current, const LimitChange& change);

// Writes `values` as the overrides file at `path`, atomically (a temporary file,
// fsync, rename, fsync of the directory, which is created when missing). False with
// errno set.
bool write_runtime_overrides(const std::string& path,
                             const std::vector<std::pair<std::string, std::string>>& values);

// The effective values in the file's format (one `key = value` per line).
std::string format_config(const DaemonOptions& o);

// Rebuilds the options from defaults, the file named at start and the same flags.
bool reread_options(const DaemonOptions& current, DaemonOptions& ret_options,
                    std::string& ret_error);

// `reload config`: re-reads the file, applies what can change at run time to
// `park` and `current`, and reports what needs a restart. Loop thread.
Status reload_options(DaemonOptions& current, Park& park, std::string& ret_message);

// "127.0.0.1:7797" or "[::1]:7797" (numeric addresses only; port 0: any free port).
bool parse_listen_address(std::string_view text, std::string& ret_host, uint16_t& ret_port);


}  // namespace kvpark::daemon
