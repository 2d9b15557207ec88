// Whether a thread of this process is parked in a blocking wait, read from
// /proc/self/task/TID: its state is S (sleeping) and the system call it sleeps
// in is futex(2), where std::mutex and std::condition_variable wait. A test that
// must show "the call has not returned yet" waits for this first, so the check
// cannot pass merely because the thread has not run.
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

namespace kvpark::testing {

// The calling thread's id (for thread_blocked_in_futex from another thread).
inline pid_t current_thread_id() {
  return static_cast<pid_t>(syscall(SYS_gettid));
}

inline bool thread_blocked_in_futex(pid_t tid) {
  const std::string task = "/proc/self/task/" + std::to_string(tid);
  std::ifstream stat_file(task + "/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');  // the name may hold spaces and ')'
  if (name_end == std::string::npos || name_end + 2 >= stat.size()) return false;
  if (stat[name_end + 2] != 'S') return false;
  std::ifstream syscall_file(task + "/syscall");
  long number = -1;
  if (!(syscall_file >> number)) return false;  // "running" while it runs
  return number == SYS_futex;
}

}  // namespace kvpark::testing
