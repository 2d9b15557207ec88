#include "proxy/slot_pool.h"

#include <algorithm>
#include <cassert>

namespace kvpark::proxy {

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + ptrdiff_t(n), b.begin()).first - a.begin());
}

void SlotPool::resize(uint32_t slots) {
  std::lock_guard lock(mutex_);
  if (slots == slots_.size()) return;
  // Busy slots keep their entries until released; only beliefs go.
  slots_.resize(slots);
  for (Slot& s : slots_) s.holds.clear();
  idle_.notify_all();
}

uint32_t SlotPool::size() const {
  std::lock_guard lock(mutex_);
  return uint32_t(slots_.size());
}

uint32_t SlotPool::busy() const {
  std::lock_guard lock(mutex_);
  return uint32_t(std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return s.busy; }));
}

uint32_t SlotPool::best_idle_locked(const std::vector<int32_t>& prompt, size_t* ret_common) const {
  uint32_t best = no_slot;
  size_t best_common = 0;
  for (uint32_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (s.busy) continue;
    const size_t common = common_prefix(s.holds, prompt);
    if (best == no_slot || common > best_common ||
        (common == best_common && s.last_used < slots_[best].last_used)) {
      best = i;
      best_common = common;
    }
  }
  *ret_common = best_common;
  return best;
}

uint32_t SlotPool::take_locked(uint32_t slot) {
  slots_[slot].busy = true;
  slots_[slot].last_used = ++clock_;
  return slot;
}

uint32_t SlotPool::acquire(const std::vector<int32_t>& prompt, size_t* ret_common) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (slots_.empty()) return no_slot;
    const uint32_t best = best_idle_locked(prompt, ret_common);
    if (best != no_slot) return take_locked(best);
    idle_.wait(lock);
  }
}

uint32_t SlotPool::try_acquire_holding(const std::vector<int32_t>& prompt, size_t common_min,
                                       size_t* ret_common) {
  std::lock_guard lock(mutex_);
  size_t common = 0;
  const uint32_t best = best_idle_locked(prompt, &common);
  if (best == no_slot || common < common_min) return no_slot;
  *ret_common = common;
  return take_locked(best);
}

uint32_t SlotPool::try_acquire_idle() {
  std::lock_guard lock(mutex_);
  uint32_t best = no_slot;
  for (uint32_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i].busy && (best == no_slot || slots_[i].last_used < slots_[best].last_used))
      best = i;
  return best == no_slot ? no_slot : take_locked(best);
}

void SlotPool::release(uint32_t slot, std::vector<int32_t> holds) {
  std::lock_guard lock(mutex_);
  if (slot >= slots_.size()) return;  // the pool shrank meanwhile
  assert(slots_[slot].busy);
  slots_[slot].busy = false;
  slots_[slot].holds = std::move(holds);
  idle_.notify_one();
}

void SlotPool::verify(const std::vector<SlotReport>& reports) {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.busy) continue;
    if (i >= reports.size() || !reports[i].known || reports[i].prompt_tokens < s.holds.size())
      s.holds.clear();
  }
}

void SlotPool::forget_all() {
  std::lock_guard lock(mutex_);
  for (Slot& s : slots_) s.holds.clear();
}

}  // namespace kvpark::proxy
