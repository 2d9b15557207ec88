// Default socket location (see paths.h).
#include "proto/paths.h"

#include <unistd.h>

#include <cstdlib>

namespace kvpark {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

}  // namespace

std::string default_socket_directory() {
  if (std::string dir = env_or_empty("RUNTIME_DIRECTORY"); !dir.empty()) {
    // systemd may list several directories separated by ':'; ours is the first.
    return dir.substr(0, dir.find(':'));
  }
  if (geteuid() == 0) return "/run/kvpark";
  if (std::string xdg = env_or_empty("XDG_RUNTIME_DIR"); !xdg.empty()) return xdg + "/kvpark";
  return "/tmp/kvpark-" + std::to_string(geteuid());
}

std::string default_socket_path() {
  if (std::string path = env_or_empty(socket_env); !path.empty()) return path;
  return default_socket_directory() + "/" + socket_file_name;
}

}  // namespace kvpark
