// The daemon's side of the remote tier: two worker threads, each owning a Redis
// client (remote/) with its own connections, so no remote I/O ever runs on the loop
// thread and a lookup's check never waits behind moving data.
//
// The loop submits jobs and reads completions when notify_fd() is readable (an
// eventfd), like the disk tier. The check lane runs the lookups' checks (the pipelined
// existence check of a missing chain, snapshot index reads) and topology refreshes;
// the data lane runs restores (gets: one entry streamed into its reserved arena
// extent; small ones queued together are pipelined in one batch) before write-behind
// puts and deletions. So a multi-GiB restore or a slow write never holds a check past
// its budget. Puts past
// remote_puts_queued_max are refused at submit (counted), so a slow store never
// holds more than that many entries pinned. The tier's state (up or down) is what
// the last job that reached the store or failed to says; the loop logs each change
// once (take_completions). While the store is down, lookups do not probe it at all,
// except one probe per backoff period that tries again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "daemon/control.h"
#include "remote/cluster_client.h"
#include "remote/record_layout.h"
#include "remote/remote_store.h"

namespace kvpark::daemon {

// Which sealed entries are written behind to the remote store.
enum class RemoteWritePolicy : uint8_t { Off = 0, Shared = 1, All = 2 };
const char* remote_write_name(RemoteWritePolicy policy);

// Write-behind jobs waiting for the worker, at most (each pins its entry).
inline constexpr size_t remote_puts_queued_max = 256;
// How long a lookup's existence check may take before the lookup gives up on it
// (a miss): the lookup's remote budget.
inline constexpr uint64_t remote_probe_budget_usec = 250'000;
// So the histogram says how many checks alone took the whole budget.
static_assert(remote_latency_has_bound(remote_probe_budget_usec));
// A tier that is down is probed again after this long (reconnect).
inline constexpr uint64_t remote_down_retry_usec = 1'000'000;
// A chain hash the store did not have is not asked for again for this long: a
// lookup, its WAIT and its second LOOKUP ask once.
inline constexpr uint64_t remote_miss_memory_usec = 2'000'000;
inline constexpr size_t remote_misses_remembered_max = 65536;
// The remote pseudo-connection: entries being restored from the store are reserved
// by it (other engines see them in flight: single flight across tiers).
inline constexpr uint32_t remote_connection_id = UINT32_MAX;

// What reading an entry from the store is expected to cost, from the restores done:
// a latency per restore (the round trips and the worker's start: from restores under
// remote_bandwidth_sample_bytes_min, their transfer at the measured bandwidth taken
// off) plus its bytes over the bandwidth (from restores of at least that size). Both
// are EWMAs; unmeasured, each term is 0.
inline constexpr uint64_t remote_bandwidth_sample_bytes_min = 1u << 20;

class RemoteReadModel {
 public:
  // A restore of `bytes` that took the worker `exec_usec`.
  void observe(uint64_t bytes, uint64_t exec_usec);
  double load_seconds(uint64_t bytes) const;
  double bytes_per_second() const { return bytes_per_second_; }
  double latency_usec() const { return latency_usec_; }

 private:
  double bytes_per_second_ = 0;  // 0: not measured
  double latency_usec_ = 0;      // 0: not measured
};

struct RemoteTierOptions {
  std::vector<remote::Endpoint> seeds;
  std::string user;
  std::string password;
  RemoteWritePolicy write_policy = RemoteWritePolicy::Shared;
  uint32_t chunk_bytes = 0;      // 0: remote::chunk_bytes_default
  uint32_t io_timeout_msec = 0;  // 0: remote::io_timeout_msec_default (tests stretch it)
};

// Index: the snapshot indexes of a lookup's anchors (snapshot-only namespaces).
enum class RemoteJobKind : uint8_t { Put, Probe, Get, Remove, Refresh, Index };

struct RemoteCompletion {
  RemoteJobKind kind = RemoteJobKind::Put;
  Status status = Status::Ok;
  uint64_t tag = 0;        // the caller's, returned as given
  uint64_t tag2 = 0;
  uint64_t start_usec = 0;  // CLOCK_MONOTONIC at submit
  uint64_t bytes = 0;
  uint64_t payload_checksum = 0;             // get: the manifest's
  uint64_t exec_usec = 0;  // the worker's time on it (queueing excluded; a batch's, shared)
  std::vector<remote::EntryKey> keys;        // probe: what was asked
  std::vector<remote::ProbeResult> results;  // probe: one per key
  std::vector<remote::IndexResult> indexes;  // index: one per key
};

// Counters and state, as status and /metrics show them.
struct RemoteTierStats {
  bool up = false;
  uint64_t nodes_known = 0;
  uint64_t nodes_up = 0;
  bool cluster = false;
  uint64_t puts = 0;             // entries written
  uint64_t puts_present = 0;     // already in the store: nothing written
  uint64_t puts_failed = 0;      // unreachable, or refused by the store
  uint64_t puts_dropped = 0;     // refused at submit: the queue was full
  uint64_t puts_pending = 0;     // accepted, not finished yet (queued or being written)
  uint64_t writes_refused = 0;   // values the store said no to (e.g. OOM)
  uint64_t probes = 0;
  uint64_t probe_keys = 0;
  uint64_t probe_hits = 0;
  uint64_t gets = 0;             // entries restored, verified
  uint64_t get_failures = 0;     // unreachable mid-restore, or a chunk gone
  uint64_t corrupt_values = 0;   // failed a check: a miss, deleted
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;
  uint64_t errors = 0;           // jobs that could not reach the store
  uint64_t redirects = 0;
  uint64_t state_changes = 0;
  // The worker's time on each job of a kind (RemoteCompletion::exec_usec), every
  // outcome: a failure's time is the store's latency too.
  RemoteLatencyHistogram probe_latency;
  RemoteLatencyHistogram get_latency;
  RemoteLatencyHistogram put_latency;
  // Every job's wait in the queue before the worker took it (submit to start): what a
  // lookup's budget pays on top of the check itself.
  RemoteLatencyHistogram queue_latency;
};

class RemoteTier {
 public:
  // Starts the workers; the check lane's first job reads the topology (a store down at
  // start is fine: the tier starts down and says so once).
  static Status open(const RemoteTierOptions& options, std::unique_ptr<RemoteTier>& ret);
  ~RemoteTier();  // stops the workers after the jobs in hand
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  int notify_fd() const { return notify_fd_; }
  RemoteWritePolicy write_policy() const { return options_.write_policy; }
  // Whether a lookup should ask the store now (up, or due for a retry).
  bool probing_useful() const;

  // Writes an entry; `image` is read until its completion (the caller pins it).
  // False when the write-behind queue is full (nothing submitted).
  bool put(const remote::EntryKey& key, const remote::ManifestHeader& header,
           const remote::ImageView& image, uint64_t tag, uint64_t tag2);
  void probe(std::vector<remote::EntryKey> keys, uint64_t tag, uint64_t tag2);
  // Reads the snapshot index of each anchor (keys' ns and key_hash); a foreground
  // job like a probe, counted as one.
  void probe_index(std::vector<remote::EntryKey> anchors, uint64_t tag, uint64_t tag2);
  // Streams an entry into `target` (kept valid by the caller until completion).
  void get(const remote::EntryKey& key, const remote::Manifest& manifest,
           const remote::ImageTarget& target, uint64_t tag, uint64_t tag2);
  // The same for several entries, queued at once so that the worker pipelines the small
  // ones (remote::batchable) in one round trip; one completion each.
  struct GetItem {
    remote::EntryKey key;
    remote::Manifest manifest;
    remote::ImageTarget target;
    uint64_t tag = 0;
    uint64_t tag2 = 0;
  };
  void get_all(std::vector<GetItem> items);
  void remove(const remote::EntryKey& key, uint32_t chunk_count);

  // Loop thread: completions since the last call; logs state changes.
  void take_completions(std::vector<RemoteCompletion>& ret);
  RemoteTierStats stats() const;
  std::string seeds_text() const;
  size_t puts_queued() const;

  // Loop thread: whether reading `bytes` from the store is expected to beat
  // recomputing them in `recompute_seconds`, by the latency and bandwidth restores
  // measured (RemoteReadModel; true until measured).
  bool load_beats_recompute(uint64_t bytes, double recompute_seconds) const {
    return read_model_.load_seconds(bytes) < recompute_seconds;
  }
  double read_bytes_per_second() const { return read_model_.bytes_per_second(); }
  double read_latency_usec() const { return read_model_.latency_usec(); }

  // Loop thread: recent misses (remote_miss_memory_usec) and probes out, with their
  // budget (remote_probe_budget_usec).
  bool missed_recently(const Hash128& hash, uint64_t now_usec) const;
  void note_missed(const Hash128& hash, uint64_t now_usec);
  void note_probe(uint64_t tag, uint64_t tag2, uint64_t now_usec);
  // Probes past their budget, oldest first (tag, tag2); forgotten once returned.
  void take_expired_probes(uint64_t now_usec, std::vector<std::pair<uint64_t, uint64_t>>& ret);

 private:
  struct Job {
    RemoteJobKind kind = RemoteJobKind::Put;
    remote::EntryKey key;
    remote::ManifestHeader header{};
    remote::Manifest manifest;
    remote::ImageView image;
    remote::ImageTarget target;
    std::vector<remote::EntryKey> keys;
    uint32_t chunk_count = 0;
    uint64_t tag = 0;
    uint64_t tag2 = 0;
    uint64_t start_usec = 0;
  };
  // A worker thread, the client it alone uses, and what its store counted so far.
  struct Lane {
    std::unique_ptr<remote::ClusterClient> client;
    std::unique_ptr<remote::RemoteStore> store;
    std::thread thread;
    std::condition_variable wake;
    remote::StoreCounters counted;  // under mutex_
    uint64_t redirects = 0;         // under mutex_
  };
  explicit RemoteTier(const RemoteTierOptions& options);
  void run(Lane& lane);
  // Under mutex_: the next jobs `lane` should run (empty: none).
  void take_jobs(Lane& lane, std::vector<Job>& ret);
  void submit(Job&& job);
  RemoteCompletion execute(Lane& lane, Job& job);
  // Worker: small gets at the queue's front, taken with `first` (under mutex_).
  void take_batchable_gets(const Job& first, std::vector<Job>& ret_more);
  void execute_gets(Lane& lane, std::vector<Job>& jobs, std::vector<RemoteCompletion>& ret);
  void account(Lane& lane, const RemoteCompletion& done, uint64_t queued_usec);  // under mutex_
  void note_reached(Lane& lane, bool reached);  // worker: the store answered (or did not)

  RemoteTierOptions options_;
  Lane checks_lane_;  // probes, index reads, refreshes
  Lane data_lane_;    // gets first, then puts and removes
  int notify_fd_ = -1;
  mutable std::mutex mutex_;
  std::deque<Job> checks_;      // probes, index reads, refreshes
  std::deque<Job> foreground_;  // gets
  std::deque<Job> background_;  // puts and removes
  std::vector<RemoteCompletion> done_;
  RemoteTierStats stats_;  // under mutex_
  bool stopping_ = false;
  std::atomic<bool> up_{false};
  std::atomic<uint64_t> last_failure_usec_{0};
  struct PendingProbe {
    uint64_t tag = 0;
    uint64_t tag2 = 0;
    uint64_t deadline_usec = 0;
  };
  std::deque<PendingProbe> probes_out_;                        // loop thread
  std::unordered_map<Hash128, uint64_t, Hash128Hasher> missed_;  // loop thread: hash -> when
  RemoteReadModel read_model_;  // loop thread
  bool logged_up_ = false;  // loop thread: the state last logged
  bool logged_once_ = false;
};

}  // namespace kvpark::daemon
