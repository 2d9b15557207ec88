// Section 2: restore and publish throughput of a 1 GiB entry, as a ratio to memcpy.
//
// The entry is a snapshot in a snapshot-only namespace (one contiguous 1 GiB
// payload), in an arena that holds exactly one such entry, so each publish evicts
// the previous one and reuses its extent. Per repetition:
//  - memcpy:         a 1 GiB copy between two private buffers, both already faulted in;
//  - publish, first: a fresh client (a fresh mapping of the arena) reserves, copies
//                    1 GiB from private memory into the reservation, and seals. The
//                    daemon committed every arena page at start, but this mapping has
//                    no page-table entries yet: every 4 KiB page takes a minor fault;
//  - publish, warm:  the same client publishes again into the same extent;
//  - restore, first: another fresh client looks the entry up, copies its 1 GiB into
//                    private memory, and releases the plan;
//  - restore, warm:  the same client restores again.
// Every timed interval covers the whole verb sequence (reserve+copy+seal,
// lookup+copy+release). Figures are medians over repetitions; restored bytes are
// checked against what was published, outside the timing.
#include <sys/mman.h>

#include <cstring>

#include "bench/bench.h"
#include "client/kvpark.h"

namespace kvpark::bench {
namespace {

constexpr size_t entry_prompt_tokens = 1000;  // tokens the snapshot's state covers

const kvpark_namespace copy_namespace = {.id = {0xc0c0c0c0ull, 2},
                                         .block_tokens = 0,
                                         .block_payload_bytes = 0,
                                         .snapshot_required = 1,
                                         .prefill_tokens_per_second = 0,
                                         .client_name = "kvpark-bench-copy"};

struct Buffer {  // private, page-aligned, faulted in
  explicit Buffer(uint64_t n) : bytes(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    data = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
    if (data != nullptr) std::memset(data, 0x5a, n);
  }
  ~Buffer() {
    if (data != nullptr) munmap(data, bytes);
  }
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// The prompt whose state entry `serial` is; the lookup prompt adds one token to prefill.
std::vector<int32_t> entry_prompt(uint64_t serial) {
  return make_tokens(1000 + serial, entry_prompt_tokens + 1);
}

// Reserve, copy `src` in, seal. Returns the reservation pointer (for the extent check) or nullptr.
void* publish(kvpark_client* client, uint64_t serial, const Buffer& src, double& ret_sec,
              std::string& ret_error) {
  const std::vector<int32_t> prompt = entry_prompt(serial);
  const kvpark_publish_options options{.session_id = serial,
                                       .entry_class = KVPARK_CLASS_PRIVATE,
                                       .evidence = KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
  std::memcpy(src.data, &serial, sizeof serial);  // each entry's bytes are its own
  const uint64_t t0 = now_nsec();
  kvpark_reservation* r = nullptr;
  kvpark_status s = kvpark_reserve_snapshot(client, &options, prompt.data(), entry_prompt_tokens,
                                            src.bytes, &r);
  void* target = s == KVPARK_OK ? kvpark_reservation_snapshot(r) : nullptr;
  if (s == KVPARK_OK) {
    std::memcpy(target, src.data, src.bytes);
    s = kvpark_seal(r);
  }
  ret_sec = double(now_nsec() - t0) * 1e-9;
  if (s != KVPARK_OK) {
    ret_error = std::string("publish: ") + kvpark_status_string(s);
    return nullptr;
  }
  return target;
}

// Lookup, copy the snapshot out into `dst`, release; checks the bytes afterwards.
bool restore(kvpark_client* client, uint64_t serial, const Buffer& src, const Buffer& dst,
             double& ret_sec, std::string& ret_error) {
  const std::vector<int32_t> prompt = entry_prompt(serial);
  std::memset(dst.data, 0, 4096);
  const uint64_t t0 = now_nsec();
  kvpark_plan* plan = nullptr;
  kvpark_status s = kvpark_lookup(client, serial, prompt.data(), prompt.size(), &plan);
  uint64_t bytes = 0;
  const void* snapshot = s == KVPARK_OK ? kvpark_plan_snapshot(plan, &bytes, nullptr) : nullptr;
  if (snapshot != nullptr && bytes == dst.bytes) std::memcpy(dst.data, snapshot, bytes);
  kvpark_plan_release(plan);
  ret_sec = double(now_nsec() - t0) * 1e-9;
  if (s != KVPARK_OK || snapshot == nullptr || bytes != dst.bytes) {
    ret_error = s != KVPARK_OK ? std::string("restore lookup: ") + kvpark_status_string(s)
                               : std::string("restore: the published snapshot was not found");
    return false;
  }
  if (std::memcmp(dst.data, src.data, dst.bytes) != 0) {
    ret_error = "restore: restored bytes differ from the published ones";
    return false;
  }
  return true;
}

}  // namespace

bool run_copy_bench(const CopyConfig& config, CopyResult& ret_result, std::string& ret_error) {
  Buffer src(config.bytes), dst(config.bytes);
  if (src.data == nullptr || dst.data == nullptr) {
    ret_error = "cannot allocate the private copy buffers";
    return false;
  }
  std::vector<double> memcpy_sec, publish_first, publish_warm, restore_first, restore_warm;
  bool reused = true;
  uint64_t serial = 0;
  std::memcpy(dst.data, src.data, config.bytes);  // warm the copy path once
  for (int rep = 0; rep < config.repetitions; ++rep) {
    uint64_t t0 = now_nsec();
    std::memcpy(dst.data, src.data, config.bytes);
    memcpy_sec.push_back(double(now_nsec() - t0) * 1e-9);

    kvpark_client* writer = nullptr;
    kvpark_client* reader = nullptr;
    kvpark_status s = kvpark_connect(config.socket_path.c_str(), &copy_namespace, &writer);
    if (s == KVPARK_OK) s = kvpark_connect(config.socket_path.c_str(), &copy_namespace, &reader);
    if (s != KVPARK_OK) {
      ret_error = std::string("connect: ") + kvpark_status_string(s);
      kvpark_disconnect(writer);
      return false;
    }
    double sec = 0;
    bool ok = true;
    void* first = publish(writer, ++serial, src, sec, ret_error);
    ok = first != nullptr;
    if (ok) publish_first.push_back(sec);
    void* second = ok ? publish(writer, ++serial, src, sec, ret_error) : nullptr;
    ok = ok && second != nullptr;
    if (ok) {
      publish_warm.push_back(sec);
      reused = reused && first == second;
    }
    ok = ok && restore(reader, serial, src, dst, sec, ret_error);
    if (ok) restore_first.push_back(sec);
    ok = ok && restore(reader, serial, src, dst, sec, ret_error);
    if (ok) restore_warm.push_back(sec);
    kvpark_disconnect(writer);
    kvpark_disconnect(reader);
    if (!ok) return false;
  }
  ret_result = {.bytes = config.bytes,
                .repetitions = config.repetitions,
                .memcpy_sec = median(memcpy_sec),
                .publish_first_sec = median(publish_first),
                .publish_warm_sec = median(publish_warm),
                .restore_first_sec = median(restore_first),
                .restore_warm_sec = median(restore_warm),
                .warm_reused_extent = reused};
  return true;
}

}  // namespace kvpark::bench
