// kvpark-proxy's options: the configuration file and the flags that mirror it.
//
// Layers, lowest first: embedded defaults, the file (--config), the command line.
// The file (kvpark-proxy(1)) is one `key = value` per line; `#` or `;` starts a
// comment line. `upstream` and `state` may repeat; any other key given twice in one
// layer is an error. Errors name their place: "path:line: message" or "--flag: ...".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::proxy {

// The project's version (meson.build's project version, passed as KVPARK_VERSION).
extern const char* const version;

struct UpstreamOptions {
  std::string name;      // the model name clients send; routes requests (several
                         // upstreams may serve one name: requests are spread)
  std::string url;       // http://host:port of a llama-server
  std::string settings;  // its flags that change state bytes (-ctk, -ctv, -fa, ...)
};

struct ProxyOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 8090;
  std::vector<UpstreamOptions> upstreams;
  std::string slot_dir;       // every upstream's --slot-save-path
  std::string socket_path;    // kvparkd's; empty: $KVPARK_SOCKET or the default
  std::string digest_cache;   // weights digests; empty: the default cache dir
  bool system_candidate = true;  // park the system/tools head without client markers
  // Park slot files as content-addressed blocks where their layout splits
  // (state_blocks.h); false: as whole files, one snapshot per position.
  bool park_blocks = true;
  // Anthropic clients stamp the first system line per request ("x-anthropic-billing-
  // header: ...; cch=XXXXX;"); normalised as llama-server does, siblings share the head.
  bool normalize_billing_header = true;
  std::string config_path;    // the file read, for messages
};

// Embedded defaults: slot dir $RUNTIME_DIRECTORY, else $XDG_RUNTIME_DIR/kvpark-proxy,
// else /dev/shm/kvpark-proxy-$UID (tmpfs), else /tmp/kvpark-proxy-$UID (created
// group-writable: llama-server writes there).
ProxyOptions default_options();

// Parses argv over defaults (reading --config first). false with a message;
// ret_exit_now is set for --help and --version (printed to stdout).
bool parse_command_line(int argc, char** argv, ProxyOptions& ret_options, bool& ret_exit_now,
                        std::string& ret_error);

// Applies a file's text; false with "path:line: message".
bool apply_config_text(const std::string& text, const std::string& path, ProxyOptions& o,
                       std::string& ret_error);

}  // namespace kvpark::proxy
