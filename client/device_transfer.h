// Device transfers: completion state, the registry of unfinished transfers (for the
// plan/reservation lifetime assertion), and the per-process table of arenas registered
// with CUDA.
//
// Model. A TransferState is shared by the kvpark_transfer handle and whoever completes it:
// the CPU worker (host path), or nobody (CUDA path: completion is observed by querying the
// transfer's events, in order). `layers_done` counts completed layers from layer_first and
// only grows; `done` is set once, with the final status. A state holds its arena mapping
// until it is observed done, so an arena registered with CUDA is never unregistered or
// unmapped under a running copy.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "proto/status.h"
#include "shm/arena.h"

namespace kvpark::client {

inline constexpr int wait_forever = -1;

// Pinned, mapped host buffers for the CUDA path's page tables and image pointer arrays,
// reused once the transfer that used one has completed.
class StagingPool {
 public:
  struct Buffer {
    uint8_t* host = nullptr;
    uint8_t* device = nullptr;  // device address of `host`
    uint64_t bytes = 0;
  };
  ~StagingPool();
  // A buffer of at least `bytes`; cudaError_t value on failure (0 = ok).
  int take(uint64_t bytes, Buffer& ret_buffer);
  void give_back(Buffer buffer);

 private:
  std::mutex mutex_;
  std::vector<Buffer> free_;
};

struct TransferState {
  // Fixed at submission.
  const void* handle = nullptr;  // the plan or reservation the copy reads or writes
  uint32_t layer_first = 0;
  uint32_t layer_count = 0;   // layers of the transfer, >= 1
  std::vector<void*> events;  // CUDA: one per layer (layerwise) or one; host: empty

  // Completion, under mutex.
  std::mutex mutex;
  std::condition_variable changed;
  uint32_t layers_done = 0;
  bool done = false;
  Status status = Status::Ok;
  std::shared_ptr<shm::ArenaMapping> mapping;  // dropped when done
  std::shared_ptr<StagingPool> pool;           // CUDA: where `staging` goes back
  StagingPool::Buffer staging;

  ~TransferState();

  // Host path: called by the worker as layers land, then once with the final status.
  void complete_layers(uint32_t layers);
  void finish(Status final_status);

  // Waits until layer index `layer_index` (0-based from layer_first; layer_count - 1 = the
  // whole transfer) has landed or the transfer failed. Ok, the failure, or InFlight on timeout.
  Status wait(uint32_t layer_index, int timeout_msec);
  // True once the transfer is done (queries CUDA events); never blocks.
  bool poll_done();

 private:
  // CUDA: advances layers_done over completed events; mutex held.
  void refresh_locked();
  void finish_locked(Status final_status);
};

// Unfinished transfers by handle; the hook libkvpark asserts with (device_access.h).
void track_in_flight(const std::shared_ptr<TransferState>& state);
void untrack_in_flight(const TransferState* state);
void install_in_flight_hook();

// Arenas registered with CUDA (cudaHostRegister, mapped), one entry per mapping, shared by
// every device in the process. `user` is the kvpark_device that will use it.
// Registers on first use; *ret_device_base is the device address of mapping->data().
Status acquire_arena(const void* user, const std::shared_ptr<shm::ArenaMapping>& mapping,
                     int cuda_device, uint8_t** ret_device_base, int* ret_cuda_error);
// Unregisters every arena that nothing but this table holds any more.
void sweep_arenas();
// `user` is going away: unregisters arenas no other device uses, then sweeps.
void release_arenas(const void* user);

}  // namespace kvpark::client
