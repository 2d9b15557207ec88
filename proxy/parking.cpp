#include "proxy/parking.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cstring>

#include "proto/xxh3.h"
#include "proxy/slot_file.h"
#include "proxy/slot_file_writer.h"

namespace kvpark::proxy {
namespace {

constexpr auto reconnect_interval = std::chrono::seconds(1);
// kvparkd answers in microseconds when well (a WAIT within limits::wait_slice_msec);
// one silent this long (stopped, hung) is taken for gone, and requests go uncached
// rather than queue behind it (libkvpark then fails calls at once for a while).
constexpr uint32_t kvparkd_reply_timeout_msec = 2'000;
// Copies the slot file out of a parked payload. Every byte comes out of the arena
// once, through libkvpark's verified read (kvparkd's checksum, checked as it copies
// into a staging buffer); the header and the body's own checksum are checked on
// that private copy: the arena is shared memory, and what is checked must be what
// llama-server reads.
bool write_checked_file(kvpark_plan* plan, uint64_t payload_bytes, uint32_t position,
                        const std::string& path, std::string* ret_refused, bool* ret_corrupt) {
  *ret_corrupt = false;
  // Reads the next part; false (with why) when libkvpark refuses it.
  auto read_part = [&](uint64_t at, void* dst, size_t n) {
    const kvpark_status s = kvpark_plan_read_snapshot(plan, at, dst, n);
    if (s == KVPARK_OK) return true;
    *ret_corrupt = s == KVPARK_CORRUPT;
    *ret_refused = *ret_corrupt ? sealed_payload_check_string(SealedPayloadCheck::bad_checksum)
                                : kvpark_status_string(s);
    return false;
  };
  SealedPayloadHeader header;
  if (payload_bytes < sizeof header) {
    *ret_refused = sealed_payload_check_string(SealedPayloadCheck::wrong_size);
    *ret_corrupt = true;
    return false;
  }
  if (!read_part(0, &header, sizeof header)) return false;
  const SealedPayloadCheck check =
      sealed_payload_check_header(&header, payload_bytes, slot_file_magic, position, &header);
  if (check != SealedPayloadCheck::ok) {
    *ret_refused = sealed_payload_check_string(check);
    *ret_corrupt = true;
    return false;
  }
  SlotFileWriter file;
  if (!file.open(path)) {
    *ret_refused = file.why();
    return false;
  }
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  bool ok = true;
  for (uint64_t at = sizeof header; ok && at < payload_bytes;) {
    size_t room = 0;
    uint8_t* part = file.space(&room);
    const size_t n = size_t(std::min<uint64_t>(room, payload_bytes - at));
    ok = read_part(at, part, n);
    if (!ok) break;
    // Hashed from the cache the copy just filled, before the writer takes it.
    XXH3_64bits_update(hash, part, n);
    at += n;
    if (!file.filled(n)) {
      *ret_refused = file.why();
      ok = false;
    }
  }
  const bool checksum_ok = XXH3_64bits_digest(hash) == header.body_xxh3_64;
  XXH3_freeState(hash);
  if (!file.finish(header.body_bytes) && ok) {  // cut: a longer last state
    *ret_refused = file.why();
    ok = false;
  }
  if (ok && !checksum_ok) {
    *ret_refused = sealed_payload_check_string(SealedPayloadCheck::bad_checksum);
    *ret_corrupt = true;
    ok = false;
  }
  if (!ok) unlink(path.c_str());
  return ok;
}

}  // namespace

Parking::Parking(std::string socket_path, std::string client_name)
    : socket_path_(std::move(socket_path)), client_name_(std::move(client_name)) {}

Parking::~Parking() = default;

ClientRef Parking::connect(const kvpark_namespace& space) const {
  kvpark_client* client = nullptr;
  if (kvpark_connect_with_reply_timeout(socket_path_.empty() ? nullptr : socket_path_.c_str(),
                                        &space, kvparkd_reply_timeout_msec, &client) != KVPARK_OK)
    return nullptr;
  return ClientRef(client, kvpark_disconnect);
}

void Parking::set_namespace(kvpark_hash128 id, uint32_t prefill_tokens_per_second,
                            std::shared_ptr<const BlockShape> shape) {
  {
    std::lock_guard lock(mutex_);
    // A shape's space is its own namespace id: the same id is the same shape.
    if (has_namespace_ && namespace_.id.low == id.low && namespace_.id.high == id.high) return;
    // Other threads may still be in a call on the old client, or hold its plans: the
    // last of them disconnects it.
    client_.reset();
    has_namespace_ = true;
    namespace_ = kvpark_namespace{.id = id,
                                  .block_tokens = shape != nullptr ? shape->block_tokens : 0,
                                  .block_payload_bytes = shape != nullptr ? shape->block_bytes : 0,
                                  // Blocks restore on their own; a whole file is a snapshot.
                                  .snapshot_required = shape != nullptr ? 0 : 1,
                                  .prefill_tokens_per_second = prefill_tokens_per_second,
                                  .client_name = client_name_.c_str()};
    shape_ = std::move(shape);
    next_attempt_ = {};
    ++namespace_generation_;
  }
  // Connected before requests come: siblings that arrive together find the client
  // (none of them goes uncached because another was connecting).
  (void)client();
}

void Parking::declare_prefill_rate(uint32_t prefill_tokens_per_second) {
  kvpark_namespace space;
  uint64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    if (!has_namespace_ || namespace_.prefill_tokens_per_second == prefill_tokens_per_second)
      return;
    namespace_.prefill_tokens_per_second = prefill_tokens_per_second;
    space = namespace_;
    generation = namespace_generation_;
  }
  // Failing, the next connection (after any failure of the old one) says it.
  ClientRef fresh = connect(space);
  std::lock_guard lock(mutex_);
  // The old client goes when its last call or plan lets go; a namespace left
  // meanwhile drops the new one instead.
  if (fresh != nullptr && generation == namespace_generation_) client_ = std::move(fresh);
}

bool Parking::has_namespace() const {
  std::lock_guard lock(mutex_);
  return has_namespace_;
}

bool Parking::parks_blocks() const {
  std::lock_guard lock(mutex_);
  return shape_ != nullptr;
}

// The lock is not held across the HELLO: a daemon that does not answer would hold
// up every request for the reply timeout. Requests that come while another thread
// connects go without kvparkd (they are uncached, not delayed).
ClientRef Parking::client(std::shared_ptr<const BlockShape>* ret_shape) {
  std::unique_lock lock(mutex_);
  if (ret_shape != nullptr) *ret_shape = shape_;
  if (client_ != nullptr || !has_namespace_ || connecting_) return client_;
  if (std::chrono::steady_clock::now() < next_attempt_) return nullptr;
  connecting_ = true;
  const kvpark_namespace space = namespace_;
  const uint64_t generation = namespace_generation_;
  lock.unlock();
  ClientRef client = connect(space);
  lock.lock();
  connecting_ = false;
  next_attempt_ = std::chrono::steady_clock::now() + reconnect_interval;
  // Connected in a namespace since left: dropped (disconnected) on return.
  if (generation == namespace_generation_) client_ = std::move(client);
  if (ret_shape != nullptr) *ret_shape = shape_;
  return client_;
}

bool Parking::connected() {
  const ClientRef c = client();
  if (c == nullptr) return false;
  kvpark_stats stats;
  // libkvpark reconnects by itself when the daemon is back.
  return kvpark_get_stats(c.get(), &stats) == KVPARK_OK;
}

// The payload is read (and verified) once, when its slot file is written.
Parked::Parked(kvpark_plan* plan, ClientRef client, std::shared_ptr<const BlockShape> shape,
               const std::vector<int32_t>& tokens)
    : client_(std::move(client)), plan_(plan), shape_(std::move(shape)) {
  if (shape_ == nullptr) {
    payload_bytes_ = kvpark_plan_snapshot_bytes(plan, &position_);
  } else {
    position_ = llama::plan_block_position(plan, *shape_, uint32_t(tokens.size()));
    tokens_.assign(tokens.begin(), tokens.begin() + position_);
  }
  reuse_kind_ = position_ > 0 ? kvpark_plan_reuse_kind(plan) : KVPARK_REUSE_ROOT;
}

uint64_t Parked::file_bytes() const {
  if (shape_ != nullptr)
    return position_ > 0 ? llama::state_image_bytes(shape_->layout, position_) : 0;
  return payload_bytes_ > sizeof(SealedPayloadHeader) ? payload_bytes_ - sizeof(SealedPayloadHeader)
                                                      : 0;
}

Parked::~Parked() {
  kvpark_plan_release(plan_);
}

void Parked::report_restored() const {
  kvpark_plan_set_restored_tokens(plan_, position_);
}

bool Parked::write_slot_file(const std::string& path, std::string* ret_refused,
                             bool* ret_corrupt) const {
  *ret_corrupt = false;
  if (position_ == 0) {
    *ret_refused = "nothing parked";
    return false;
  }
  if (shape_ != nullptr)
    return write_slot_file_from_blocks(plan_, *shape_, tokens_, position_, path, ret_refused,
                                       ret_corrupt);
  return write_checked_file(plan_, payload_bytes_, position_, path, ret_refused, ret_corrupt);
}

std::unique_ptr<Parked> Parking::lookup(const std::vector<int32_t>& tokens, uint64_t session_id,
                                        uint32_t promotion_wait_msec, uint32_t inflight_wait_msec) {
  std::shared_ptr<const BlockShape> shape;
  ClientRef client = this->client(&shape);
  kvpark_plan* plan = nullptr;
  if (client == nullptr ||
      kvpark_lookup(client.get(), session_id, tokens.data(), tokens.size(), &plan) != KVPARK_OK)
    return std::make_unique<Parked>();
  // On timeout, what is ready stays usable.
  if (kvpark_plan_inflight_tokens(plan) > 0)
    kvpark_plan_wait(plan, inflight_wait_msec);
  else if (kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan))
    kvpark_plan_wait(plan, promotion_wait_msec);
  return std::make_unique<Parked>(plan, std::move(client), std::move(shape), tokens);
}

kvpark_status Parking::reserve(const std::vector<int32_t>& tokens, uint32_t position,
                               const kvpark_publish_options& options, uint64_t file_bytes,
                               Reserved* ret_reserved) {
  std::shared_ptr<const BlockShape> shape;
  ClientRef c = client(&shape);
  if (c == nullptr) return KVPARK_UNAVAILABLE;
  if (shape != nullptr) return reserve_blocks(std::move(c), std::move(shape), tokens, position,
                                              options, ret_reserved);
  kvpark_reservation* reservation = nullptr;
  const kvpark_status s =
      kvpark_reserve_snapshot(c.get(), &options, tokens.data(), position,
                              sizeof(SealedPayloadHeader) + file_bytes, &reservation);
  if (s == KVPARK_OK) {
    ret_reserved->client_ = std::move(c);
    ret_reserved->reservation_ = reservation;
    ret_reserved->position_ = position;
    ret_reserved->file_bytes_ = file_bytes;
  }
  return s;
}

Reserved::~Reserved() {
  abort();
}

void Reserved::abort() {
  if (reservation_ != nullptr) kvpark_abort(reservation_);
  reservation_ = nullptr;
  blocks_.abort();
}

bool Reserved::fill_and_seal(const std::string& file_path, std::string* ret_error,
                             SlotCheck* ret_check) {
  assert(reserved());
  if (ret_check != nullptr) *ret_check = SlotCheck{};
  if (shape_ != nullptr) return fill_blocks_and_seal(file_path, ret_error, ret_check);
  const int fd = open(file_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    *ret_error = file_path + ": " + std::strerror(errno);
    if (fd >= 0) close(fd);
    return false;
  }
  if (uint64_t(st.st_size) != file_bytes_) {
    close(fd);
    *ret_error = "the slot file has " + std::to_string(st.st_size) + " bytes, " +
                 std::to_string(file_bytes_) + " were reserved";
    return false;
  }
  auto* payload = static_cast<uint8_t*>(kvpark_reservation_snapshot(reservation_));
  uint8_t* file = payload + sizeof(SealedPayloadHeader);
  bool ok = true;
  for (uint64_t at = 0; at < file_bytes_;) {
    const ssize_t n = read(fd, file + at, size_t(file_bytes_ - at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *ret_error =
          file_path + (n == 0 ? ": shrank while read" : ": " + std::string(std::strerror(errno)));
      ok = false;
      break;
    }
    at += uint64_t(n);
  }
  close(fd);
  if (!ok) return false;  // the destructor aborts
  sealed_payload_seal(payload, slot_file_magic, position_, file_bytes_);
  const kvpark_status sealed = kvpark_seal(reservation_);
  reservation_ = nullptr;  // sealed or not, it is gone
  if (sealed != KVPARK_OK) {
    *ret_error = std::string("seal: ") + kvpark_status_string(sealed);
    return false;
  }
  return true;
}

kvpark_status Parking::reserve_blocks(ClientRef c, std::shared_ptr<const BlockShape> shape,
                                      const std::vector<int32_t>& tokens, uint32_t position,
                                      const kvpark_publish_options& options,
                                      Reserved* ret_reserved) {
  assert(position <= tokens.size() && !ret_reserved->reserved());
  Reserved& r = *ret_reserved;
  const kvpark_status s = r.blocks_.reserve(c.get(), shape, options, tokens.data(), position);
  if (s != KVPARK_OK) return s;
  r.client_ = std::move(c);
  r.position_ = position;
  r.tokens_.assign(tokens.begin(), tokens.begin() + position);
  r.shape_ = std::move(shape);
  return KVPARK_OK;
}

bool Reserved::fill_blocks_and_seal(const std::string& file_path, std::string* ret_error,
                                    SlotCheck* ret_check) {
  SlotImage image;
  const SlotImageCheck check =
      read_slot_image(file_path, *shape_, tokens_, position_, &image, ret_error);
  if (ret_check != nullptr) *ret_check = SlotCheck{.result = check, .space = shape_->space};
  if (check != SlotImageCheck::ok) return false;  // the destructor aborts
  if (const kvpark_status sealed = blocks_.fill_and_seal(image.parsed, image.bytes.get());
      sealed != KVPARK_OK) {
    *ret_error = std::string("seal: ") + kvpark_status_string(sealed);
    return false;
  }
  return true;
}

bool Parking::park_file(const std::vector<int32_t>& tokens, uint32_t position,
                        const kvpark_publish_options& options, const std::string& file_path,
                        uint64_t file_bytes, std::string* ret_error, SlotCheck* ret_check) {
  if (ret_check != nullptr) *ret_check = SlotCheck{};
  Reserved reserved;
  const kvpark_status s = reserve(tokens, position, options, file_bytes, &reserved);
  if (s == KVPARK_ALREADY_PRESENT || s == KVPARK_IN_FLIGHT) return true;
  if (s != KVPARK_OK) {
    *ret_error = s == KVPARK_UNAVAILABLE ? std::string("kvparkd unavailable")
                                         : std::string("reserve: ") + kvpark_status_string(s);
    return false;
  }
  return reserved.fill_and_seal(file_path, ret_error, ret_check);
}

}  // namespace kvpark::proxy
