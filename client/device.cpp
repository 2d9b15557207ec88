// The libkvpark device API (kvpark_device.h): plans and reservations <-> a paged KV cache.
//
// Model. A call validates everything on the host (range, page ids of the range, block
// pointers) and fails before anything is queued; a queued copy therefore only fails for
// device reasons. The page table is copied, rebased to the first page of the range (the
// kernels index it by logical page), so the engine's array is free on return.
//   Host path: one worker thread per device runs queued jobs in submission order.
//   CUDA path: submissions are serialised per device; each enqueues kernel launches on the
//   attached stream that read the page table and image pointers from pinned staging
//   memory and the images from the registered arena, then records its event(s).
// Park skips the reservation's NULL blocks by moving each run of non-NULL blocks separately.
#include "client/kvpark_device.h"

#include <cassert>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "client/c_boundary.h"
#include "client/device_access.h"
#include "client/device_cuda.h"
#include "client/device_transfer.h"
#include "kvpark_kernels.h"
#include "kvpark_kernels_cuda.h"

namespace kernels = kvpark::kernels;
using kvpark::Status;
using kvpark::client::TransferState;
using kvpark::client::status_of_current_exception;

namespace {

kvpark_status to_c(Status s) {
  return static_cast<kvpark_status>(s);
}

// A queued copy: runs of blocks, each moved with its own BlockTransfer.
struct Run {
  uint64_t first_token = 0;  // relative to the copied page table's first page
  uint32_t n_tokens = 0;
  uint32_t first_image = 0;  // index into Job::images
};

struct Job {
  std::shared_ptr<TransferState> state;
  bool gather = false;  // park (cache -> images); else restore
  bool layerwise = false;
  std::vector<int32_t> pages;  // the range's slice of the page table
  std::vector<void*> images;   // host addresses of the block payloads
  std::vector<Run> runs;
};

}  // namespace

struct kvpark_device {
  kvpark_client* client = nullptr;
  uint32_t block_tokens = 0;
  kernels::KvCacheGeometry geometry;
  std::vector<void*> k, v;  // copies of the caller's arrays
  bool cuda = false;
  int cuda_device = -1;
  void* stream = nullptr;

  std::mutex mutex;  // everything below
  // Host path.
  std::condition_variable work_ready;
  std::deque<Job> queue;
  bool stopping = false;
  std::thread worker;
  // CUDA path.
  std::shared_ptr<kvpark::client::StagingPool> pool;
  std::vector<std::weak_ptr<TransferState>> outstanding;

  kernels::PagedKvCache cache() const {
    return {.geometry = geometry, .k = k.data(), .v = v.empty() ? nullptr : v.data()};
  }
};

struct kvpark_transfer {
  std::shared_ptr<TransferState> state;
};

namespace {

kernels::BlockTransfer block_transfer(const Job& job, const Run& run, const int32_t* pages,
                                      void* const* images, uint32_t block_tokens,
                                      uint32_t layer_first, uint32_t layer_count) {
  return {.page_table = pages,
          .page_table_len = static_cast<uint32_t>(job.pages.size()),
          .first_token = run.first_token,
          .n_tokens = run.n_tokens,
          .block_tokens = block_tokens,
          .block_images = images + run.first_image,
          .layer_first = layer_first,
          .layer_count = layer_count};
}

// Host path: the worker's body for one job.
void run_host_job(const kvpark_device& dev, const Job& job) {
  TransferState& s = *job.state;
  const kernels::PagedKvCache cache = dev.cache();
  auto copy_layers = [&](uint32_t layer_first, uint32_t layer_count) {
    for (const Run& run : job.runs) {
      const kernels::BlockTransfer t = block_transfer(job, run, job.pages.data(), job.images.data(),
                                                      dev.block_tokens, layer_first, layer_count);
      const kernels::KernelStatus ks =
          job.gather ? kernels::gather_cpu(cache, t) : kernels::scatter_cpu(cache, t);
      // Validated at submission with the same arrays: a failure here is a bug.
      assert(ks == kernels::KernelStatus::ok);
      if (ks != kernels::KernelStatus::ok) return false;
    }
    return true;
  };
  if (job.layerwise) {
    for (uint32_t i = 0; i < s.layer_count; ++i) {
      if (!copy_layers(s.layer_first + i, 1)) return s.finish(Status::InvalidArgument);
      s.complete_layers(i + 1);
    }
  } else if (!copy_layers(s.layer_first, s.layer_count)) {
    return s.finish(Status::InvalidArgument);
  }
  s.finish(Status::Ok);
}

void worker_loop(kvpark_device* dev) {
  std::unique_lock lock(dev->mutex);
  for (;;) {
    dev->work_ready.wait(lock, [&] { return dev->stopping || !dev->queue.empty(); });
    if (dev->queue.empty()) return;  // stopping, and drained
    Job job = std::move(dev->queue.front());
    dev->queue.pop_front();
    lock.unlock();
    run_host_job(*dev, job);
    lock.lock();
  }
}

// CUDA path: stages the arrays, launches, records events. Ok: the job is on the stream.
Status submit_cuda(kvpark_device* dev, Job& job,
                   const std::shared_ptr<kvpark::shm::ArenaMapping>& mapping) {
  TransferState& s = *job.state;
  std::lock_guard lock(dev->mutex);
  std::erase_if(dev->outstanding, [](const auto& w) { return w.expired(); });
  dev->outstanding.reserve(dev->outstanding.size() + 1);  // no throw once kernels run
  kvpark::client::cuda::DeviceGuard guard(dev->cuda_device);
  if (guard.error() != 0) return Status::IoError;
  uint8_t* device_base = nullptr;
  int cuda_error = 0;
  if (Status st =
          kvpark::client::acquire_arena(dev, mapping, dev->cuda_device, &device_base, &cuda_error);
      st != Status::Ok) {
    return st;
  }
  const size_t event_count = job.layerwise ? s.layer_count : 1;
  s.events.reserve(event_count);  // an event created is an event kept
  for (size_t i = 0; i < event_count; ++i) {
    void* event = nullptr;
    if (kvpark::client::cuda::event_create(&event) != 0) return Status::IoError;
    s.events.push_back(event);  // destroyed with the state
  }
  const uint64_t pages_bytes = (job.pages.size() * sizeof(int32_t) + 15) / 16 * 16;
  const uint64_t bytes = pages_bytes + job.images.size() * sizeof(void*);
  s.pool = dev->pool;
  if (s.pool->take(bytes, s.staging) != 0) return Status::IoError;
  std::memcpy(s.staging.host, job.pages.data(), job.pages.size() * sizeof(int32_t));
  auto* device_images = reinterpret_cast<void**>(s.staging.host + pages_bytes);
  const auto* arena = mapping->data();
  for (size_t i = 0; i < job.images.size(); ++i) {
    device_images[i] = device_base + (static_cast<uint8_t*>(job.images[i]) - arena);
  }
  const auto* pages = reinterpret_cast<const int32_t*>(s.staging.device);
  auto* images = reinterpret_cast<void* const*>(s.staging.device + pages_bytes);
  const kernels::PagedKvCache cache = dev->cache();
  bool launched = false;
  auto copy_layers = [&](uint32_t layer_first, uint32_t layer_count) {
    for (const Run& run : job.runs) {
      const kernels::BlockTransfer t =
          block_transfer(job, run, pages, images, dev->block_tokens, layer_first, layer_count);
      const kernels::KernelStatus ks =
          job.gather ? kernels::gather_cuda(cache, t, dev->stream, &cuda_error)
                     : kernels::scatter_cuda(cache, t, dev->stream, &cuda_error);
      if (ks != kernels::KernelStatus::ok) return false;
      launched = true;
    }
    return true;
  };
  bool ok = true;
  if (job.layerwise) {
    for (uint32_t i = 0; ok && i < s.layer_count; ++i) {
      ok = copy_layers(s.layer_first + i, 1) &&
           kvpark::client::cuda::event_record(s.events[i], dev->stream) == 0;
    }
  } else {
    ok = copy_layers(s.layer_first, s.layer_count) &&
         kvpark::client::cuda::event_record(s.events[0], dev->stream) == 0;
  }
  if (!ok) {
    // Launched copies still read the staging buffer: let them drain before it is reused.
    if (launched && kvpark::client::cuda::event_record(s.events.back(), dev->stream) == 0) {
      (void)kvpark::client::cuda::event_synchronize(s.events.back());
    }
    return Status::IoError;
  }
  dev->outstanding.push_back(job.state);
  return Status::Ok;
}

// Checks, builds and queues a job; the common tail of restore and park.
kvpark_status submit(kvpark_device* dev, Job job, const kvpark::client::Attachment& attachment,
                     kvpark_transfer** ret_transfer) {
  auto handle = std::make_unique<kvpark_transfer>(kvpark_transfer{job.state});
  TransferState& s = *job.state;
  if (job.runs.empty()) {  // nothing to move: every block already parked
    s.finish(Status::Ok);
    *ret_transfer = handle.release();
    return KVPARK_OK;
  }
  s.mapping = attachment.mapping;
  kvpark::client::track_in_flight(job.state);
  try {
    if (dev->cuda) {
      if (Status st = submit_cuda(dev, job, attachment.mapping); st != Status::Ok) {
        s.finish(st);  // untracks; drops the mapping
        return to_c(st);
      }
    } else {
      std::lock_guard lock(dev->mutex);
      dev->queue.push_back(std::move(job));
      dev->work_ready.notify_one();
    }
  } catch (...) {
    s.finish(Status::OutOfMemory);  // never started: untracked, the plan is free to go
    throw;
  }
  *ret_transfer = handle.release();
  return KVPARK_OK;
}

// The range's slice of the page table, rebased: token first_token becomes token
// ret_first_relative of the slice.
bool slice_pages(const kvpark_device* dev, const int32_t* page_table, size_t n_pages,
                 uint64_t first_token, uint32_t n_tokens, std::vector<int32_t>& ret_pages,
                 uint64_t& ret_first_relative) {
  const uint32_t pt = dev->geometry.page_tokens;
  const uint64_t first_page = first_token / pt;
  const uint64_t end_page = (first_token + n_tokens + pt - 1) / pt;
  if (page_table == nullptr || end_page > n_pages) return false;
  ret_pages.assign(page_table + first_page, page_table + end_page);
  ret_first_relative = first_token - first_page * pt;
  return true;
}

// Every run of the job, validated as the kernels will see it (page ids, image pointers).
bool job_valid(const kvpark_device* dev, const Job& job, uint32_t layer_first,
               uint32_t layer_count) {
  const kernels::PagedKvCache cache = dev->cache();
  for (const Run& run : job.runs) {
    const kernels::BlockTransfer t = block_transfer(job, run, job.pages.data(), job.images.data(),
                                                    dev->block_tokens, layer_first, layer_count);
    if (kernels::validate_transfer_arrays(cache, t) != kernels::KernelStatus::ok) return false;
  }
  return true;
}

// Pair assertion with kvpark.cpp: a block pointer lies inside its handle's arena mapping.
void assert_in_arena(const kvpark::client::Attachment& a, const void* block, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(block);
  assert(a.mapping != nullptr && p >= a.mapping->data() &&
         a.mapping->contains(static_cast<uint64_t>(p - a.mapping->data()), bytes));
  (void)a, (void)p, (void)bytes;
}

uint64_t block_bytes(const kvpark_device* dev) {
  return kernels::image_bytes(dev->geometry, dev->block_tokens);
}

}  // namespace

// The C boundary (client/c_boundary.h): every body that can throw catches.
extern "C" {

int kvpark_device_cuda_built(void) {
  return kvpark::client::cuda::built() ? 1 : 0;
}

kvpark_status kvpark_device_attach(kvpark_client* client, const kvpark_kv_cache* c,
                                   void* cuda_stream, kvpark_device** ret_device) try {
  if (client == nullptr || c == nullptr || ret_device == nullptr || c->k == nullptr) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const kvpark::Geometry ns = kvpark::client::client_geometry(client);
  if (ns.block_tokens == 0) return KVPARK_INVALID_ARGUMENT;  // snapshot-only: no blocks
  if ((c->layout != KVPARK_KV_NHD && c->layout != KVPARK_KV_HND) ||
      (c->fusion != KVPARK_KV_SEPARATE && c->fusion != KVPARK_KV_FUSED) ||
      (c->memory != KVPARK_MEMORY_HOST && c->memory != KVPARK_MEMORY_CUDA)) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const bool fused = c->fusion == KVPARK_KV_FUSED;
  const kernels::KvCacheGeometry g{
      .layers = c->layers,
      .pages_total = c->pages_total,
      .page_tokens = c->page_tokens,
      .kv_heads = c->kv_heads,
      .head_dim = c->head_dim,
      .elem_bytes = c->elem_bytes,
      .layout = c->layout == KVPARK_KV_NHD ? kernels::KvLayout::nhd : kernels::KvLayout::hnd,
      .fusion = fused ? kernels::KvFusion::fused : kernels::KvFusion::separate};
  if (kernels::validate_geometry(g) != kernels::KernelStatus::ok) return KVPARK_INVALID_ARGUMENT;
  if (fused != (c->v == nullptr)) return KVPARK_INVALID_ARGUMENT;
  for (uint32_t l = 0; l < g.layers; ++l) {
    if (c->k[l] == nullptr || (!fused && c->v[l] == nullptr)) return KVPARK_INVALID_ARGUMENT;
  }
  if (kernels::image_bytes(g, ns.block_tokens) != ns.block_payload_bytes) {
    return KVPARK_GEOMETRY_MISMATCH;
  }
  const bool cuda = c->memory == KVPARK_MEMORY_CUDA;
  if (!cuda && cuda_stream != nullptr) return KVPARK_INVALID_ARGUMENT;
  if (cuda &&
      (!kvpark::client::cuda::built() || kvpark::client::cuda::check_device(c->cuda_device) != 0)) {
    return KVPARK_UNAVAILABLE;
  }
  auto dev = std::make_unique<kvpark_device>();
  dev->client = client;
  dev->block_tokens = ns.block_tokens;
  dev->geometry = g;
  dev->k.assign(c->k, c->k + g.layers);
  if (!fused) dev->v.assign(c->v, c->v + g.layers);
  dev->cuda = cuda;
  dev->cuda_device = cuda ? c->cuda_device : -1;
  dev->stream = cuda_stream;
  if (cuda) {
    dev->pool = std::make_shared<kvpark::client::StagingPool>();
  } else {
    dev->worker = std::thread(worker_loop, dev.get());
  }
  kvpark::client::install_in_flight_hook();
  *ret_device = dev.release();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void kvpark_device_detach(kvpark_device* dev) try {
  if (dev == nullptr) return;
  if (dev->cuda) {
    std::vector<std::weak_ptr<TransferState>> outstanding;
    {
      std::lock_guard lock(dev->mutex);
      outstanding.swap(dev->outstanding);
    }
    for (auto& w : outstanding) {
      if (auto s = w.lock()) (void)s->wait(s->layer_count - 1, kvpark::client::wait_forever);
    }
    kvpark::client::release_arenas(dev);
  } else {
    {
      std::lock_guard lock(dev->mutex);
      dev->stopping = true;
      dev->work_ready.notify_one();
    }
    dev->worker.join();
  }
  delete dev;
} catch (...) {
  // A lock or join the system refused: the worker may still use the device; keep it.
}

kvpark_status kvpark_device_restore(kvpark_device* dev, const kvpark_plan* plan,
                                    const int32_t* page_table, size_t n_pages, uint64_t first_token,
                                    uint32_t n_tokens, uint32_t layer_first, uint32_t layer_count,
                                    uint32_t flags, kvpark_transfer** ret_transfer) try {
  if (dev == nullptr || plan == nullptr || ret_transfer == nullptr ||
      (flags & ~KVPARK_TRANSFER_LAYERWISE) != 0) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const kvpark::client::HandleView view = kvpark::client::plan_view(plan);
  const uint32_t bt = dev->block_tokens;
  const uint32_t layers = dev->geometry.layers;
  if (view.client != dev->client || n_tokens == 0 || first_token % bt != 0 || n_tokens % bt != 0 ||
      n_tokens > kernels::transfer_tokens_max ||
      (first_token + n_tokens) / bt > kvpark_plan_block_count(plan) || layer_first >= layers) {
    return KVPARK_INVALID_ARGUMENT;
  }
  if (layer_count == 0) layer_count = layers - layer_first;
  if (layer_count > layers - layer_first) return KVPARK_INVALID_ARGUMENT;
  kvpark::client::sweep_arenas();
  Job job;
  uint64_t first_relative = 0;
  if (!slice_pages(dev, page_table, n_pages, first_token, n_tokens, job.pages, first_relative)) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const size_t first_block = first_token / bt;
  for (size_t i = 0; i < n_tokens / bt; ++i) {
    // Verified in place against the daemon's checksum; a writer that changes the
    // bytes after this check and before the copy lands is not caught (docs/kernels.md).
    const void* block = kvpark_plan_block(plan, first_block + i);
    if (block == nullptr) return KVPARK_CORRUPT;
    assert_in_arena(*view.attachment, block, block_bytes(dev));
    job.images.push_back(const_cast<void*>(block));  // scatter only reads it
  }
  job.runs.push_back({.first_token = first_relative, .n_tokens = n_tokens, .first_image = 0});
  if (!job_valid(dev, job, layer_first, layer_count)) return KVPARK_INVALID_ARGUMENT;
  job.layerwise = (flags & KVPARK_TRANSFER_LAYERWISE) != 0;
  job.state = std::make_shared<TransferState>();
  job.state->handle = plan;
  job.state->layer_first = layer_first;
  job.state->layer_count = layer_count;
  return submit(dev, std::move(job), *view.attachment, ret_transfer);
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_device_park(kvpark_device* dev, const kvpark_reservation* reservation,
                                 const int32_t* page_table, size_t n_pages, uint64_t first_token,
                                 uint32_t n_tokens, kvpark_transfer** ret_transfer) try {
  if (dev == nullptr || reservation == nullptr || ret_transfer == nullptr) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const kvpark::client::HandleView view = kvpark::client::reservation_view(reservation);
  const uint32_t bt = dev->block_tokens;
  const size_t blocks = kvpark_reservation_block_count(reservation);
  if (view.client != dev->client || blocks == 0 || first_token % bt != 0 ||
      n_tokens > kernels::transfer_tokens_max || uint64_t{n_tokens} != blocks * bt) {
    return KVPARK_INVALID_ARGUMENT;
  }
  kvpark::client::sweep_arenas();
  Job job;
  uint64_t first_relative = 0;
  if (!slice_pages(dev, page_table, n_pages, first_token, n_tokens, job.pages, first_relative)) {
    return KVPARK_INVALID_ARGUMENT;
  }
  for (size_t i = 0; i < blocks; ++i) {
    void* block = kvpark_reservation_block(reservation, i);
    if (block == nullptr) continue;  // already parked, or another engine writes it
    assert_in_arena(*view.attachment, block, block_bytes(dev));
    const uint64_t token = first_relative + i * bt;
    if (!job.runs.empty() && job.runs.back().first_token + job.runs.back().n_tokens == token) {
      job.runs.back().n_tokens += bt;
    } else {
      job.runs.push_back({.first_token = token,
                          .n_tokens = bt,
                          .first_image = static_cast<uint32_t>(job.images.size())});
    }
    job.images.push_back(block);
  }
  const uint32_t layers = dev->geometry.layers;
  if (!job_valid(dev, job, 0, layers)) return KVPARK_INVALID_ARGUMENT;
  job.gather = true;
  job.state = std::make_shared<TransferState>();
  job.state->handle = reservation;
  job.state->layer_first = 0;
  job.state->layer_count = layers;
  return submit(dev, std::move(job), *view.attachment, ret_transfer);
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_transfer_wait(kvpark_transfer* t, int timeout_ms) try {
  if (t == nullptr) return KVPARK_INVALID_ARGUMENT;
  return to_c(t->state->wait(t->state->layer_count - 1, timeout_ms));
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_transfer_poll(kvpark_transfer* t) {
  return kvpark_transfer_wait(t, 0);
}

kvpark_status kvpark_transfer_wait_layer(kvpark_transfer* t, uint32_t layer, int timeout_ms) try {
  if (t == nullptr || layer < t->state->layer_first ||
      layer - t->state->layer_first >= t->state->layer_count) {
    return KVPARK_INVALID_ARGUMENT;
  }
  return to_c(t->state->wait(layer - t->state->layer_first, timeout_ms));
} catch (...) {
  return status_of_current_exception();
}

void* kvpark_transfer_event(const kvpark_transfer* t, uint32_t layer) {
  if (t == nullptr || t->state->events.empty() || layer < t->state->layer_first ||
      layer - t->state->layer_first >= t->state->layer_count) {
    return nullptr;
  }
  const TransferState& s = *t->state;
  return s.events.size() == 1 ? s.events[0] : s.events[layer - s.layer_first];
}

void kvpark_transfer_free(kvpark_transfer* t) try {
  if (t == nullptr) return;
  (void)t->state->wait(t->state->layer_count - 1, kvpark::client::wait_forever);
  kvpark::client::untrack_in_flight(t->state.get());
  delete t;
} catch (...) {
  delete t;  // a wait the system refused: the state lives on with its job
}

}  // extern "C"
