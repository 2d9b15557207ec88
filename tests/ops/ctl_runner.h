// Running kvparkctl (or any binary) for a test: exit code, stdout and stderr
// apart, optionally with stdout on a terminal (a pseudo-terminal of a given width).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"

namespace kvpark::testing {

struct RunResult {
  int code = -1;  // exit code; -1 timed out (killed)
  std::string out;
  std::string err;
};

// Runs argv to completion within timeout_msec. `tty_columns` > 0 puts stdout on a
// pseudo-terminal that many columns wide (out then has the terminal's \r\n).
inline RunResult run_capture(const std::vector<std::string>& argv, int timeout_msec,
                             unsigned tty_columns = 0,
                             const std::vector<std::string>& env_overrides = {}) {
  RunResult r;
  int out_fds[2] = {-1, -1}, err_fds[2] = {-1, -1};
  if (tty_columns > 0) {
    winsize ws{};
    ws.ws_row = 50;
    ws.ws_col = static_cast<unsigned short>(tty_columns);
    if (openpty(&out_fds[0], &out_fds[1], nullptr, nullptr, &ws) != 0) return r;
    fcntl(out_fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(out_fds[1], F_SETFD, FD_CLOEXEC);
  } else if (pipe2(out_fds, O_CLOEXEC) != 0) {
    return r;
  }
  if (pipe2(err_fds, O_CLOEXEC) != 0) return r;
  const pid_t pid = spawn(argv, out_fds[1], err_fds[1], env_overrides);
  close(out_fds[1]);
  close(err_fds[1]);
  const uint64_t deadline = now_msec() + static_cast<uint64_t>(timeout_msec);
  bool out_open = true, err_open = true;
  char buffer[4096];
  while (pid > 0 && (out_open || err_open) && now_msec() < deadline) {
    pollfd p[2] = {{out_open ? out_fds[0] : -1, POLLIN, 0},
                   {err_open ? err_fds[0] : -1, POLLIN, 0}};
    if (poll(p, 2, static_cast<int>(deadline - now_msec())) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].revents == 0) continue;
      const ssize_t n = read(i == 0 ? out_fds[0] : err_fds[0], buffer, sizeof buffer);
      if (n <= 0)
        (i == 0 ? out_open : err_open) = false;  // EOF, or EIO on a closed pty
      else
        (i == 0 ? r.out : r.err).append(buffer, static_cast<size_t>(n));
    }
  }
  close(out_fds[0]);
  close(err_fds[0]);
  if (pid <= 0) return r;
  const uint64_t now = now_msec();
  const int status = wait_with_timeout(pid, now < deadline ? static_cast<int>(deadline - now) : 1);
  if (status == -1) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return r;
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Lines of text without their \r\n or \n.
inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t end; (end = text.find('\n', start)) != std::string::npos; start = end + 1) {
    std::string line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

// Display columns of UTF-8 text.
inline size_t display_columns(const std::string& line) {
  size_t columns = 0;
  for (unsigned char c : line) columns += (c & 0xC0) != 0x80;
  return columns;
}

}  // namespace kvpark::testing
