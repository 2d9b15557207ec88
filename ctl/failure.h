// kvparkctl's exit codes and the one way a verb gives up.
#pragma once

#include <cstdio>
#include <string>

namespace kvpark::ctl {

// Documented in kvparkctl(1) and --help.
enum Exit : int {
  exit_ok = 0,
  exit_failure = 1,
  exit_usage = 2,
  exit_not_found = 3,
  exit_permission_denied = 4,
  exit_unavailable = 5,  // neither D-Bus nor (for read verbs) HTTP reached kvparkd
};

// A failure already reported to stderr, carrying its exit code.
struct Failure {
  int code;
};

// Prints "kvparkctl: MESSAGE" and throws Failure{code}.
[[noreturn]] inline void fail(int code, const std::string& message) {
  fprintf(stderr, "kvparkctl: %s\n", message.c_str());
  throw Failure{code};
}

// kvparkd is not reachable this way (no bus, not on the bus, nothing listening);
// nothing printed yet: the caller decides whether another way is tried.
struct Unreachable {
  std::string reason;
};

}  // namespace kvpark::ctl
