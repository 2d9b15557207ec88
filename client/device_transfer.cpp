// Transfer completion, the in-flight registry and the CUDA arena table (device_transfer.h).
#include "client/device_transfer.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <thread>
#include <unordered_map>

#include "client/device_access.h"
#include "client/device_cuda.h"
#include "kvpark_kernels_cuda.h"

namespace kvpark::client {

namespace kernels = kvpark::kernels;
using Clock = std::chrono::steady_clock;

// ---- StagingPool ----

StagingPool::~StagingPool() {
  for (Buffer& b : free_) cuda::host_free(b.host);
}

int StagingPool::take(uint64_t bytes, Buffer& ret_buffer) {
  {
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->bytes >= bytes) {
        ret_buffer = *it;
        free_.erase(it);
        return 0;
      }
    }
  }
  uint64_t rounded = 4096;
  while (rounded < bytes) rounded *= 2;
  void* host = nullptr;
  void* device = nullptr;
  if (int e = cuda::host_alloc_mapped(rounded, &host, &device); e != 0) return e;
  ret_buffer = {static_cast<uint8_t*>(host), static_cast<uint8_t*>(device), rounded};
  return 0;
}

void StagingPool::give_back(Buffer buffer) {
  std::lock_guard lock(mutex_);
  free_.push_back(buffer);
}

// ---- TransferState ----

TransferState::~TransferState() {
  for (void* e : events) cuda::event_destroy(e);
  if (pool != nullptr && staging.host != nullptr) pool->give_back(staging);
}

void TransferState::complete_layers(uint32_t layers) {
  std::lock_guard lock(mutex);
  assert(layers >= layers_done && layers <= layer_count);
  layers_done = layers;
  changed.notify_all();
}

void TransferState::finish(Status final_status) {
  {
    std::lock_guard lock(mutex);
    finish_locked(final_status);
  }
  untrack_in_flight(this);
}

void TransferState::finish_locked(Status final_status) {
  if (done) return;
  done = true;
  status = final_status;
  if (final_status == Status::Ok) layers_done = layer_count;
  mapping.reset();  // nothing touches the arena any more
  if (pool != nullptr && staging.host != nullptr) {
    pool->give_back(staging);
    staging = {};
  }
  changed.notify_all();
}

void TransferState::refresh_locked() {
  if (done || events.empty()) return;
  const uint32_t per_event = events.size() == 1 ? layer_count : 1;
  while (!done) {
    const uint32_t next = layers_done / per_event;
    assert(next < events.size());
    bool event_done = false;
    if (cuda::event_query(events[next], &event_done) != 0) {
      finish_locked(Status::IoError);
      return;
    }
    if (!event_done) return;
    layers_done += per_event;
    if (layers_done == layer_count) finish_locked(Status::Ok);
  }
}

bool TransferState::poll_done() {
  bool finished = false;
  {
    std::lock_guard lock(mutex);
    refresh_locked();
    finished = done;
  }
  if (finished) untrack_in_flight(this);
  return finished;
}

Status TransferState::wait(uint32_t layer_index, int timeout_msec) {
  assert(layer_index < layer_count);
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(timeout_msec, 0));
  std::unique_lock lock(mutex);
  auto landed = [&] { return done || layers_done > layer_index; };
  if (events.empty()) {  // host path: the worker notifies
    if (timeout_msec == wait_forever) {
      changed.wait(lock, landed);
    } else {
      changed.wait_until(lock, deadline, landed);
    }
  } else {  // CUDA: query the events, blocking on one only when there is no deadline
    auto backoff = std::chrono::microseconds(10);
    for (refresh_locked(); !landed(); refresh_locked()) {
      if (timeout_msec == wait_forever) {
        const uint32_t per_event = events.size() == 1 ? layer_count : 1;
        void* event = events[layer_index / per_event];
        lock.unlock();
        (void)cuda::event_synchronize(event);  // an error shows in the next query
        lock.lock();
        continue;
      }
      if (Clock::now() >= deadline) break;
      lock.unlock();
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::microseconds(1000));
      lock.lock();
    }
  }
  const bool finished = done;
  const Status result = done && status != Status::Ok ? status
                        : landed()                   ? Status::Ok
                                                     : Status::InFlight;
  lock.unlock();
  if (finished) untrack_in_flight(this);
  return result;
}

// ---- in-flight registry ----

namespace {

std::mutex in_flight_mutex;
std::unordered_multimap<const void*, std::shared_ptr<TransferState>> in_flight;

bool handle_in_flight(const void* handle) {
  std::vector<std::shared_ptr<TransferState>> states;
  {
    std::lock_guard lock(in_flight_mutex);
    auto [first, last] = in_flight.equal_range(handle);
    for (auto it = first; it != last; ++it) states.push_back(it->second);
  }
  bool any = false;
  for (auto& s : states) any = !s->poll_done() || any;
  return any;
}

}  // namespace

void track_in_flight(const std::shared_ptr<TransferState>& state) {
  std::lock_guard lock(in_flight_mutex);
  in_flight.emplace(state->handle, state);
}

void untrack_in_flight(const TransferState* state) {
  std::shared_ptr<TransferState> last;  // destroyed after the lock is dropped
  std::lock_guard lock(in_flight_mutex);
  auto [first, end] = in_flight.equal_range(state->handle);
  for (auto it = first; it != end; ++it) {
    if (it->second.get() == state) {
      last = std::move(it->second);
      in_flight.erase(it);
      break;
    }
  }
}

void install_in_flight_hook() {
  transfer_in_flight_hook.store(&handle_in_flight, std::memory_order_release);
}

// ---- CUDA arena table ----

namespace {

struct ArenaRegistration {
  std::shared_ptr<shm::ArenaMapping> mapping;
  uint8_t* device_base = nullptr;
  int cuda_device = 0;
  std::vector<const void*> users;
};

std::mutex arenas_mutex;
std::vector<ArenaRegistration> arenas;

void unregister(ArenaRegistration& r) {
  cuda::DeviceGuard guard(r.cuda_device);
  // The mapping outlives this call (r.mapping), so the range is still ours to unpin.
  (void)kernels::cuda_host_unregister(r.mapping->data());
}

// Removes, and unregisters, the entries `pred` selects; arenas_mutex held.
template <typename Pred>
void drop_arenas_locked(Pred pred) {
  for (auto it = arenas.begin(); it != arenas.end();) {
    if (pred(*it)) {
      unregister(*it);
      it = arenas.erase(it);  // the mapping may be unmapped here, after unregistering
    } else {
      ++it;
    }
  }
}

}  // namespace

Status acquire_arena(const void* user, const std::shared_ptr<shm::ArenaMapping>& mapping,
                     int cuda_device, uint8_t** ret_device_base, int* ret_cuda_error) {
  std::lock_guard lock(arenas_mutex);
  // Only this table holds it: no plan, reservation, transfer or connection can reach it.
  drop_arenas_locked([](const ArenaRegistration& r) { return r.mapping.use_count() == 1; });
  for (ArenaRegistration& r : arenas) {
    if (r.mapping == mapping) {
      if (std::find(r.users.begin(), r.users.end(), user) == r.users.end()) {
        r.users.push_back(user);
      }
      *ret_device_base = r.device_base;
      return Status::Ok;
    }
  }
  void* device_base = nullptr;
  int error = 0;
  cuda::DeviceGuard guard(cuda_device);
  const kernels::KernelStatus ks =
      kernels::cuda_host_register(mapping->data(), mapping->data_bytes(), &device_base, &error);
  if (ks != kernels::KernelStatus::ok) {
    *ret_cuda_error = error;
    return ks == kernels::KernelStatus::device_unavailable ? Status::Unavailable : Status::IoError;
  }
  arenas.push_back({.mapping = mapping,
                    .device_base = static_cast<uint8_t*>(device_base),
                    .cuda_device = cuda_device,
                    .users = {user}});
  *ret_device_base = static_cast<uint8_t*>(device_base);
  return Status::Ok;
}

void sweep_arenas() {
  std::lock_guard lock(arenas_mutex);
  drop_arenas_locked([](const ArenaRegistration& r) { return r.mapping.use_count() == 1; });
}

void release_arenas(const void* user) {
  std::lock_guard lock(arenas_mutex);
  for (ArenaRegistration& r : arenas) std::erase(r.users, user);
  drop_arenas_locked(
      [](const ArenaRegistration& r) { return r.users.empty() || r.mapping.use_count() == 1; });
}

}  // namespace kvpark::client
