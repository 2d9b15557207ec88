// The service manager's side of the file descriptor store (sd_notify(3),
// sd_listen_fds(3)), played by the test harness where no systemd runs.
//
// A daemon sends "FDSTORE=1\nFDNAME=name" with fds attached (SCM_RIGHTS) on
// $NOTIFY_SOCKET; the manager keeps them (one copy of each open file, as systemd
// does: the same file stored again is not stored twice) and hands them back at the
// next start as fds 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the
// child's own pid, set after fork). "FDSTOREREMOVE=1\nFDNAME=name" closes every fd
// of that name. Fds sent without FDSTORE=1 are closed, as systemd closes them.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvpark::testing {

struct StoredFd {
  std::string name;
  int fd = -1;  // owned by the store
};

class ManagerFdStore {
 public:
  ManagerFdStore() = default;
  ~ManagerFdStore() { clear(); }
  ManagerFdStore(const ManagerFdStore&) = delete;
  ManagerFdStore& operator=(const ManagerFdStore&) = delete;

  // One notify message and the fds that came with it (taken: kept or closed).
  void handle(const std::string& message, const std::vector<int>& fds);
  // What `systemctl stop` does: the store is emptied.
  void clear();

  const std::vector<StoredFd>& fds() const { return fds_; }
  // The first fd stored under `name`; -1 when none.
  int fd(const std::string& name) const;
  size_t count(const std::string& name) const;
  // Fds closed by FDSTOREREMOVE=1 since the store was made.
  uint64_t removed() const { return removed_; }
  uint64_t stored() const { return stored_; }  // FDSTORE=1 fds kept

 private:
  std::vector<StoredFd> fds_;
  uint64_t removed_ = 0;
  uint64_t stored_ = 0;
};

// A notify datagram and its fds, read from a nonblocking socket; false when none is
// queued. Fds beyond what fits the control buffer are lost (the kernel closes them).
bool receive_notify(int notify_fd, std::string& ret_message, std::vector<int>& ret_fds);

// fork+exec of argv with stderr on stderr_fd and `env` as the whole environment,
// passing the store's fds as 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and
// LISTEN_PID = the child's pid (when the store is empty, none of them). -1 on failure.
pid_t spawn_with_fds(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                     int stderr_fd, const ManagerFdStore& store);

}  // namespace kvpark::testing
