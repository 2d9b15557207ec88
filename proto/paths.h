// Where the daemon listens unless told otherwise; shared by kvparkd and libkvpark.
#pragma once

#include <string>

namespace kvpark {

inline constexpr const char* socket_file_name = "kvparkd.sock";
inline constexpr const char* socket_env = "KVPARK_SOCKET";

// $KVPARK_SOCKET; else $RUNTIME_DIRECTORY (systemd); else /run/kvpark for root;
// else $XDG_RUNTIME_DIR/kvpark; else /tmp/kvpark-$UID.
std::string default_socket_path();

// The directory default_socket_path() lives in (created by the daemon).
std::string default_socket_directory();

}  // namespace kvpark
