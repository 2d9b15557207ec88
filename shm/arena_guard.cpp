// SIGBUS recovery for the daemon's own arena accesses (see arena_guard.h).
//
// A guarded access runs between sigsetjmp and the end of the copy with the thread's
// `active` flag set; the handler jumps back only when the flag is set and the fault
// address lies in the arena, so a fault anywhere else still ends the process as a
// bug should. SA_NODEFER leaves SIGBUS unblocked after the jump, so sigsetjmp need
// not save the signal mask (no system call per access).
#include "shm/arena_guard.h"

#include <setjmp.h>
#include <signal.h>

#include <atomic>
#include <cstring>

namespace kvpark::shm {
namespace {

const uint8_t* guarded_base = nullptr;
uint64_t guarded_bytes = 0;
std::atomic<uint64_t> fault_count{0};

thread_local sigjmp_buf recovery;
thread_local volatile sig_atomic_t active = 0;

void on_sigbus(int signal_number, siginfo_t* info, void*) {
  const auto* address = static_cast<const uint8_t*>(info->si_addr);
  if (active != 0 && address >= guarded_base && address < guarded_base + guarded_bytes) {
    active = 0;
    siglongjmp(recovery, 1);
  }
  // Not ours: the default action, on the faulting access when this returns.
  signal(signal_number, SIG_DFL);
}

template <typename Access>
bool guarded(Access access) {
  if (guarded_base == nullptr) return access();  // no handler (in-process tests): unguarded
  if (sigsetjmp(recovery, 0) != 0) {
    fault_count.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  active = 1;
  const bool result = access();
  active = 0;
  return result;
}

}  // namespace

void guard_arena(const uint8_t* base, uint64_t bytes) {
  guarded_base = base;
  guarded_bytes = bytes;
  struct sigaction action {};
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaction(SIGBUS, &action, nullptr);
}

bool guarded_copy(void* dst, const void* src, size_t count) {
  return guarded([&] {
    std::memcpy(dst, src, count);
    return true;
  });
}

bool guarded_equal(const void* a, const void* b, size_t count) {
  return guarded([&] { return std::memcmp(a, b, count) == 0; });
}

uint64_t arena_faults() { return fault_count.load(std::memory_order_relaxed); }

}  // namespace kvpark::shm
