// kvparkd for one upstream: its namespace, the connection, and the two things the
// proxy does there: restore a parked slot file into the slot directory, and park
// one the upstream saved.
//
// The connection is made lazily and made again after a failure (at most once per
// reconnect interval), so a daemon that is down, restarting or gone makes requests
// uncached, never failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/kvpark.h"

namespace kvpark::proxy {

// A lookup's result, holding its lease: the parked state cannot be evicted until
// this is destroyed.
class Parked {
 public:
  Parked() = default;
  explicit Parked(kvpark_plan* plan);
  ~Parked();
  Parked(const Parked&) = delete;
  Parked& operator=(const Parked&) = delete;

  uint32_t position() const { return position_; }  // tokens covered; 0: nothing
  kvpark_reuse_kind reuse_kind() const { return reuse_kind_; }
  // Checks the parked payload and writes its slot file to path; false with why.
  // *ret_corrupt: the payload failed its checks (not an I/O error on the file).
  bool write_slot_file(const std::string& path, std::string* ret_refused,
                       bool* ret_corrupt) const;

 private:
  kvpark_plan* plan_ = nullptr;
  uint32_t position_ = 0;
  kvpark_reuse_kind reuse_kind_ = KVPARK_REUSE_ROOT;
  const void* payload_ = nullptr;
  uint64_t payload_bytes_ = 0;
};

class Parking {
 public:
  Parking(std::string socket_path, std::string client_name);
  ~Parking();
  Parking(const Parking&) = delete;
  Parking& operator=(const Parking&) = delete;

  // A new namespace drops the connection; the next call connects in it.
  void set_namespace(kvpark_hash128 id, uint32_t prefill_tokens_per_second);
  bool has_namespace() const;
  bool connected();

  // The longest parked prefix of tokens, waiting up to wait_msec for a promotion
  // from disk or a state another engine is writing. Nothing found when the daemon
  // is away.
  std::unique_ptr<Parked> lookup(const std::vector<int32_t>& tokens, uint64_t session_id,
                                 uint32_t wait_msec);
  // Parks the slot file at file_path as the state after tokens[0, position).
  // Already parked is success. false with a reason otherwise.
  bool park_file(const std::vector<int32_t>& tokens, uint32_t position,
                 const kvpark_publish_options& options, const std::string& file_path,
                 std::string* ret_error);

 private:
  kvpark_client* client_locked();  // connects when needed; nullptr if unavailable

  const std::string socket_path_;
  const std::string client_name_;
  mutable std::mutex mutex_;
  bool has_namespace_ = false;
  kvpark_namespace namespace_{};
  kvpark_client* client_ = nullptr;
  std::vector<kvpark_client*> retired_;  // earlier namespaces' clients, freed at exit
  std::chrono::steady_clock::time_point next_attempt_{};
};

}  // namespace kvpark::proxy
