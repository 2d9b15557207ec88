// The slots of one upstream and what the proxy believes each holds.
//
// A belief is the prompt the proxy last ran in the slot: a prefix of what
// llama-server's cache for it really holds, unless someone else used the slot or
// the upstream restarted, which verify() catches through GET /slots. A wrong belief
// costs time (a prefill or a needless restore), never a wrong answer: llama-server
// matches its cache against every prompt itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "proxy/upstream.h"

namespace kvpark::proxy {

inline constexpr uint32_t no_slot = UINT32_MAX;

class SlotPool {
 public:
  // Sets the slot count (from /props); beliefs are dropped when it changes.
  void resize(uint32_t slots);
  uint32_t size() const;

  // Waits for an idle slot and takes the one whose belief shares the longest prefix
  // with prompt (least recently used among equals). *ret_common: that prefix.
  // no_slot when the pool has no slots.
  uint32_t acquire(const std::vector<int32_t>& prompt, size_t* ret_common);
  // Without waiting: the idle slot whose belief shares the longest prefix with prompt,
  // if that is at least common_min tokens; no_slot otherwise. *ret_common: that prefix.
  uint32_t try_acquire_holding(const std::vector<int32_t>& prompt, size_t common_min,
                               size_t* ret_common);
  // An idle slot, least recently used, without waiting; no_slot when all are busy.
  uint32_t try_acquire_idle();
  // Gives the slot back, now believed to hold `holds` (empty: unknown).
  void release(uint32_t slot, std::vector<int32_t> holds);
  // Drops beliefs that GET /slots contradicts (a restarted upstream holds nothing).
  void verify(const std::vector<SlotReport>& reports);
  void forget_all();
  uint32_t busy() const;

 private:
  struct Slot {
    bool busy = false;
    std::vector<int32_t> holds;
    uint64_t last_used = 0;
  };
  // Under mutex_: the idle slot holding the longest prefix of `prompt` (the least
  // recently used among equals), no_slot when all are busy; *ret_common: that prefix.
  uint32_t best_idle_locked(const std::vector<int32_t>& prompt, size_t* ret_common) const;
  uint32_t take_locked(uint32_t slot);  // marks it busy and used now; returns it
  mutable std::mutex mutex_;
  std::condition_variable idle_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

}  // namespace kvpark::proxy
