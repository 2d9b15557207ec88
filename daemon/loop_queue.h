// Runs work from other threads (D-Bus, HTTP) on the event loop thread.
//
// post() queues a closure and wakes the loop through an eventfd; call() waits
// for its result. After close() (the loop is stopping) nothing more runs:
// call() returns std::nullopt at once, so an adapter thread never hangs on a
// loop that is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

namespace kvpark::daemon {

class LoopQueue {
 public:
  LoopQueue();
  ~LoopQueue();
  LoopQueue(const LoopQueue&) = delete;
  LoopQueue& operator=(const LoopQueue&) = delete;

  int event_fd() const { return event_fd_; }
  // Loop thread: runs everything queued so far.
  void drain();
  // Loop thread, at shutdown: refuses new work and drops what is queued.
  void close();

  // Any thread but the loop's: runs `work` on the loop and returns its result;
  // std::nullopt when the loop is closed or, with a nonzero timeout_usec, did not
  // answer in time.
  template <typename Result>
  std::optional<Result> call(std::function<Result()> work, uint64_t timeout_usec = 0) {
    struct Slot {
      std::mutex mutex;
      std::condition_variable done_cv;
      std::optional<Result> result;
      bool done = false;
    };
    auto slot = std::make_shared<Slot>();
    bool queued = post([slot, work = std::move(work)](bool run) {
      std::optional<Result> result;
      if (run) result = work();
      std::lock_guard lock(slot->mutex);
      slot->result = std::move(result);
      slot->done = true;
      slot->done_cv.notify_one();
    });
    if (!queued) return std::nullopt;
    std::unique_lock lock(slot->mutex);
    if (timeout_usec == 0) {
      slot->done_cv.wait(lock, [&] { return slot->done; });
    } else if (!slot->done_cv.wait_for(lock, std::chrono::microseconds(timeout_usec),
                                       [&] { return slot->done; })) {
      return std::nullopt;  // the closure still runs later, into the shared slot
    }
    return std::move(slot->result);
  }

 private:
  // The closure gets run=false when dropped at close().
  bool post(std::function<void(bool run)> work);

  int event_fd_ = -1;
  std::mutex mutex_;
  std::deque<std::function<void(bool)>> queue_;
  bool closed_ = false;
};

}  // namespace kvpark::daemon
