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
#include "proxy/state_blocks.h"

namespace kvpark::proxy {

// A connection to kvparkd, disconnected when the last holder lets go: the Parking
// that made it, a call in progress, or a plan or reservation made on it.
using ClientRef = std::shared_ptr<kvpark_client>;

// A lookup's result, holding its lease: the parked state cannot be evicted until
// this is destroyed.
class Parked {
 public:
  Parked() = default;
  // shape: the namespace parks blocks of that shape (tokens: the lookup's), else
  // whole slot files.
  Parked(kvpark_plan* plan, ClientRef client, std::shared_ptr<const BlockShape> shape,
         const std::vector<int32_t>& tokens);
  ~Parked();
  Parked(const Parked&) = delete;
  Parked& operator=(const Parked&) = delete;

  uint32_t position() const { return position_; }  // tokens covered; 0: nothing
  kvpark_reuse_kind reuse_kind() const { return reuse_kind_; }
  uint64_t file_bytes() const;  // the slot file's size
  // Checks the parked payload and writes its slot file to path, over what the file
  // held (its pages are reused); false with why.
  // *ret_corrupt: the payload failed its checks (not an I/O error on the file).
  bool write_slot_file(const std::string& path, std::string* ret_refused,
                       bool* ret_corrupt) const;
  // The state is in the slot: kvparkd counts position() tokens restored at release.
  void report_restored() const;

 private:
  ClientRef client_;  // outlives the plan (released first)
  kvpark_plan* plan_ = nullptr;
  uint32_t position_ = 0;
  kvpark_reuse_kind reuse_kind_ = KVPARK_REUSE_ROOT;
  uint64_t payload_bytes_ = 0;  // whole slot files: the snapshot's
  std::shared_ptr<const BlockShape> shape_;
  std::vector<int32_t> tokens_;  // blocks: [0, position_), for the slot file's token list
};

// A state reserved in kvparkd (a whole slot file's snapshot, or blocks and a tail),
// its slot file still to come: while it exists, other processes' lookups see its
// tokens in flight and wait for them (single flight across processes). Aborted
// unless sealed.
// How a saved slot file fared against the block shape it was to be parked in.
struct SlotCheck {
  SlotImageCheck result = SlotImageCheck::ok;  // ok when parking whole
  kvpark_hash128 space{};                      // the shape's, when it was checked
};

class Reserved {
 public:
  Reserved() = default;
  ~Reserved();
  Reserved(const Reserved&) = delete;
  Reserved& operator=(const Reserved&) = delete;
  bool reserved() const { return reservation_ != nullptr || blocks_.reserved(); }
  void abort();
  // Copies the slot file in (a whole one must have exactly the reserved size; blocks
  // are cut from one holding at least the reserved tokens) and seals.
  // *ret_check (optional): how the file fared against the reservation's block shape.
  bool fill_and_seal(const std::string& file_path, std::string* ret_error,
                     SlotCheck* ret_check = nullptr);

 private:
  friend class Parking;
  bool fill_blocks_and_seal(const std::string& file_path, std::string* ret_error,
                            SlotCheck* ret_check);

  ClientRef client_;  // outlives the reservations
  kvpark_reservation* reservation_ = nullptr;  // a whole file
  llama::BlockReservation blocks_;            // or blocks and a tail
  uint32_t position_ = 0;
  uint64_t file_bytes_ = 0;
  std::shared_ptr<const BlockShape> shape_;
  std::vector<int32_t> tokens_;  // blocks: [0, position_)
};

class Parking {
 public:
  Parking(std::string socket_path, std::string client_name);
  ~Parking();
  Parking(const Parking&) = delete;
  Parking& operator=(const Parking&) = delete;

  // A new namespace drops the connection; the next call connects in it. With a
  // shape, the namespace parks blocks of it (id is then the shape's space).
  void set_namespace(kvpark_hash128 id, uint32_t prefill_tokens_per_second,
                     std::shared_ptr<const BlockShape> shape = nullptr);
  bool has_namespace() const;
  bool parks_blocks() const;
  // Declares the namespace's prefill rate anew (kvparkd's value model weighs what a
  // parked state saves by it): a new connection says it in its HELLO, and replaces the
  // old one once it is made, so no request goes uncached meanwhile. Blocks for that
  // round trip: not for a request's path.
  void declare_prefill_rate(uint32_t prefill_tokens_per_second);
  // kvparkd answers now (a round trip, at most the reply timeout; never under a lock
  // other requests need).
  bool connected();

  // The longest parked prefix of tokens, waiting up to promotion_wait_msec for a
  // promotion from disk, or up to inflight_wait_msec for a state another request
  // (any process) is prefilling. Nothing found when the daemon is away.
  std::unique_ptr<Parked> lookup(const std::vector<int32_t>& tokens, uint64_t session_id,
                                 uint32_t promotion_wait_msec, uint32_t inflight_wait_msec);
  // Reserves the state after tokens[0, position) for a slot file of file_bytes
  // (ignored when parking blocks). KVPARK_ALREADY_PRESENT / KVPARK_IN_FLIGHT: nothing
  // to write.
  kvpark_status reserve(const std::vector<int32_t>& tokens, uint32_t position,
                        const kvpark_publish_options& options, uint64_t file_bytes,
                        Reserved* ret_reserved);
  // Parks the slot file at file_path, of file_bytes, as the state after
  // tokens[0, position). Already parked is success. false with a reason otherwise.
  bool park_file(const std::vector<int32_t>& tokens, uint32_t position,
                 const kvpark_publish_options& options, const std::string& file_path,
                 uint64_t file_bytes, std::string* ret_error, SlotCheck* ret_check = nullptr);

 private:
  // Connects when needed; nullptr if unavailable, or while another thread connects.
  // *ret_shape: the namespace's block shape, as of the client returned.
  ClientRef client(std::shared_ptr<const BlockShape>* ret_shape = nullptr);
  kvpark_status reserve_blocks(ClientRef c, std::shared_ptr<const BlockShape> shape,
                               const std::vector<int32_t>& tokens, uint32_t position,
                               const kvpark_publish_options& options, Reserved* ret_reserved);
  ClientRef connect(const kvpark_namespace& space) const;  // nullptr if it cannot

  const std::string socket_path_;
  const std::string client_name_;
  mutable std::mutex mutex_;
  bool has_namespace_ = false;
  kvpark_namespace namespace_{};
  std::shared_ptr<const BlockShape> shape_;  // null: whole slot files
  uint64_t namespace_generation_ = 0;  // set_namespace calls
  ClientRef client_;
  bool connecting_ = false;  // a thread is saying HELLO, without the lock
  std::chrono::steady_clock::time_point next_attempt_{};
};

}  // namespace kvpark::proxy
