// Cross-thread work queue for the event loop (see loop_queue.h).
#include "daemon/loop_queue.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cassert>
#include <cstdint>

namespace kvpark::daemon {

LoopQueue::LoopQueue() : event_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  assert(event_fd_ >= 0);
}

LoopQueue::~LoopQueue() {
  close();
  ::close(event_fd_);
}

bool LoopQueue::post(std::function<void(bool)> work) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return false;
    queue_.push_back(std::move(work));
  }
  const uint64_t one = 1;
  (void)write(event_fd_, &one, sizeof one);
  return true;
}

void LoopQueue::drain() {
  uint64_t count = 0;
  (void)read(event_fd_, &count, sizeof count);
  std::deque<std::function<void(bool)>> batch;
  {
    std::lock_guard lock(mutex_);
    batch.swap(queue_);
  }
  for (auto& work : batch) work(true);
}

void LoopQueue::close() {
  std::deque<std::function<void(bool)>> dropped;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    dropped.swap(queue_);
  }
  for (auto& work : dropped) work(false);
}

}  // namespace kvpark::daemon
