// A private message bus for D-Bus tests: a dbus-daemon the test starts on a
// socket in its own directory, configured like a session bus that any uid may
// join (so a test running as root can also call it as `nobody`), optionally
// with kvpark's system-bus policy file included. Also: running a command as
// another uid and capturing its stdout.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"

namespace kvpark::testing {

inline constexpr const char* dbus_daemon_path = "/usr/bin/dbus-daemon";

class PrivateBus {
 public:
  // `policy_file`: a busconfig to <include> after the permissive defaults.
  explicit PrivateBus(const std::string& policy_file = "") {
    char templ[] = "/tmp/kvpark-bus-XXXXXX";
    directory_ = mkdtemp(templ);
    chmod(directory_.c_str(), 0755);  // other uids reach the socket
    const std::string config = directory_ + "/bus.conf";
    std::ofstream(config)
        << "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN\"\n"
           " \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n"
           "<busconfig>\n  <type>session</type>\n"
           "  <listen>unix:path=" << directory_ << "/bus</listen>\n"
           "  <auth>EXTERNAL</auth>\n"
           "  <policy context=\"default\">\n"
           "    <allow user=\"*\"/>\n    <allow own=\"*\"/>\n"
           "    <allow send_destination=\"*\"/>\n    <allow receive_sender=\"*\"/>\n"
           "  </policy>\n"
        << (policy_file.empty() ? "" : "  <include>" + policy_file + "</include>\n")
        << "</busconfig>\n";
    child_ = std::make_unique<ChildProcess>(spawn_process(
        {dbus_daemon_path, "--config-file=" + config, "--nofork", "--print-address=1"}));
    address_ = read_line(child_->stdout_fd, 10'000);
  }
  ~PrivateBus() {
    child_->kill_hard();
    std::error_code ec;
    std::filesystem::remove_all(directory_, ec);
  }

  bool running() const { return !address_.empty(); }
  const std::string& address() const { return address_; }

  static bool available() { return access(dbus_daemon_path, X_OK) == 0; }

 private:
  static std::string read_line(int fd, int timeout_msec) {
    std::string line;
    char c;
    while (true) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, timeout_msec) <= 0 || read(fd, &c, 1) != 1) return "";
      if (c == '\n') return line;
      line.push_back(c);
    }
  }

  std::string directory_;
  std::string address_;
  std::unique_ptr<ChildProcess> child_;
};

// Runs argv as `uid`/`gid` with no supplementary groups (fork, drop, exec);
// returns its exit code (-1 on timeout) and stdout in ret_output.
inline int run_as(uid_t uid, gid_t gid, const std::vector<std::string>& argv, int timeout_msec,
                  std::string* ret_output) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(126);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  std::string output;
  char buffer[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, timeout_msec) <= 0) break;
    const ssize_t n = read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;
    output.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  const int status = wait_with_timeout(pid, timeout_msec);
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  if (ret_output != nullptr) *ret_output = output;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace kvpark::testing
