// Where the daemon listens unless told otherwise; shared by kvparkd and libkvpark.
#pragma once

#include <string>

namespace kvpark {

inline constexpr const char* socket_file_name = "kvparkd.sock";
inline constexpr const char* socket_env = "KVPARK_SOCKET";

// kvparkd's HTTP status API unless http_listen says otherwise; kvparkctl reads
// http_listen from the same configuration file to find it without D-Bus.
inline constexpr const char* http_listen_default = "127.0.0.1:7797";
inline constexpr const char* daemon_config_path_default = "/etc/kvpark/kvparkd.conf";

// $KVPARK_SOCKET; else $RUNTIME_DIRECTORY (systemd); else /run/kvpark for root;
// else $XDG_RUNTIME_DIR/kvpark; else /tmp/kvpark-$UID.
std::string default_socket_path();

// The directory default_socket_path() lives in (created by the daemon).
std::string default_socket_directory();

}  // namespace kvpark
