// The fd store through libsystemd (see fd_store.h).
#include "daemon/fd_store.h"

#include <fcntl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace kvpark::daemon {

StoredFds take_stored_fds() {
  StoredFds fds;
  char** names = nullptr;
  const int n = sd_listen_fds_with_names(1, &names);
  for (int i = 0; i < n; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
    const char* name = names != nullptr && names[i] != nullptr ? names[i] : "";
    int* slot = std::strcmp(name, fd_name_arena_header) == 0   ? &fds.arena_header
                : std::strcmp(name, fd_name_arena_data) == 0   ? &fds.arena_data
                : std::strcmp(name, fd_name_state) == 0        ? &fds.state
                : std::strcmp(name, fd_name_index_memory) == 0 ? &fds.index_memory
                                                               : nullptr;
    if (slot == nullptr || *slot >= 0) {
      close(fd);
      ++fds.others;
    } else {
      *slot = fd;
    }
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) free(names[i]);
    free(names);
  }
  return fds;
}

void close_stored_fds(StoredFds& fds) {
  for (int* fd : {&fds.arena_header, &fds.arena_data, &fds.state}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

int store_fd(const char* name, int fd) {
  const std::string message = std::string("FDSTORE=1\nFDNAME=") + name;
  const int r = sd_pid_notify_with_fds(0, 0, message.c_str(), &fd, 1);
  return r < 0 ? r : 0;
}

int remove_stored_fds(const char* name) {
  const std::string message = std::string("FDSTOREREMOVE=1\nFDNAME=") + name;
  const int r = sd_notify(0, message.c_str());
  return r < 0 ? r : 0;
}

bool service_manager_present() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

}  // namespace kvpark::daemon
