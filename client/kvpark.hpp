// Thin C++ wrapper over the libkvpark C ABI (kvpark.h): RAII for clients, plans
// and reservations; statuses stay values (no exceptions).
//
//   kvpark::Client client;
//   if (client.connect(nullptr, ns) != KVPARK_OK) ...;
//   kvpark::Plan plan;
//   client.lookup(session, tokens, plan);
//   for (size_t i = 0; i < plan.block_count(); ++i) copy_in(plan.block(i));
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "kvpark.h"  // same folder in the tree and once installed

namespace kvpark {

// Owns one C handle; Free is the C function that releases it.
template <typename T, auto Free>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T* raw) : raw_(raw) {}
  Handle(Handle&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) reset(std::exchange(other.raw_, nullptr));
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }

  T* get() const { return raw_; }
  T* release() { return std::exchange(raw_, nullptr); }
  void reset(T* raw = nullptr) {
    if (raw_ != nullptr) Free(raw_);
    raw_ = raw;
  }
  explicit operator bool() const { return raw_ != nullptr; }

 private:
  T* raw_ = nullptr;
};

inline void abort_reservation(kvpark_reservation* r) { (void)kvpark_abort(r); }

class Plan : public Handle<kvpark_plan, kvpark_plan_release> {
 public:
  using Handle::Handle;
  uint32_t restorable_tokens() const { return kvpark_plan_restorable_tokens(get()); }
  kvpark_reuse_kind reuse_kind() const { return kvpark_plan_reuse_kind(get()); }
  uint32_t pending_tokens() const { return kvpark_plan_pending_tokens(get()); }
  uint32_t inflight_tokens() const { return kvpark_plan_inflight_tokens(get()); }
  uint32_t capture_hint() const { return kvpark_plan_capture_hint(get()); }
  void set_restored_tokens(uint32_t tokens) { kvpark_plan_set_restored_tokens(get(), tokens); }
  kvpark_status wait(uint32_t timeout_msec) { return kvpark_plan_wait(get(), timeout_msec); }
  size_t block_count() const { return kvpark_plan_block_count(get()); }
  const void* block(size_t index) const { return kvpark_plan_block(get(), index); }
  const void* snapshot(uint64_t* ret_bytes, uint32_t* ret_position) const {
    return kvpark_plan_snapshot(get(), ret_bytes, ret_position);
  }
};

// Dropping a reservation without seal() aborts it.
class Reservation : public Handle<kvpark_reservation, abort_reservation> {
 public:
  using Handle::Handle;
  size_t block_count() const { return kvpark_reservation_block_count(get()); }
  void* block(size_t index) const { return kvpark_reservation_block(get(), index); }
  void* snapshot() const { return kvpark_reservation_snapshot(get()); }
  kvpark_status seal() { return kvpark_seal(release()); }
  kvpark_status abort() { return kvpark_abort(release()); }
};

class Client : public Handle<kvpark_client, kvpark_disconnect> {
 public:
  using Handle::Handle;

  kvpark_status connect(const char* socket_path, const kvpark_namespace& ns) {
    kvpark_client* raw = nullptr;
    kvpark_status s = kvpark_connect(socket_path, &ns, &raw);
    if (s == KVPARK_OK) reset(raw);
    return s;
  }
  uint32_t chain_tokens() const { return kvpark_chain_tokens(get()); }

  kvpark_status lookup(uint64_t session_id, std::span<const int32_t> tokens, Plan& ret_plan) {
    kvpark_plan* raw = nullptr;
    kvpark_status s = kvpark_lookup(get(), session_id, tokens.data(), tokens.size(), &raw);
    if (s == KVPARK_OK) ret_plan.reset(raw);
    return s;
  }
  kvpark_status reserve_blocks(const kvpark_publish_options& options,
                               std::span<const int32_t> tokens, size_t first_block,
                               size_t block_count, Reservation& ret_reservation) {
    kvpark_reservation* raw = nullptr;
    kvpark_status s = kvpark_reserve_blocks(get(), &options, tokens.data(), tokens.size(),
                                            first_block, block_count, &raw);
    if (s == KVPARK_OK) ret_reservation.reset(raw);
    return s;
  }
  kvpark_status reserve_snapshot(const kvpark_publish_options& options,
                                 std::span<const int32_t> tokens, uint64_t payload_bytes,
                                 Reservation& ret_reservation) {
    kvpark_reservation* raw = nullptr;
    kvpark_status s = kvpark_reserve_snapshot(get(), &options, tokens.data(), tokens.size(),
                                              payload_bytes, &raw);
    if (s == KVPARK_OK) ret_reservation.reset(raw);
    return s;
  }
  kvpark_status stats(kvpark_stats& ret_stats) { return kvpark_get_stats(get(), &ret_stats); }
};

}  // namespace kvpark
