// The remote tier's worker thread and job queues (see remote_tier.h).
#include "daemon/remote_tier.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>

#include "daemon/clock.h"
#include "daemon/log.h"
#include "remote/remote_limits.h"

namespace kvpark::daemon {

const char* remote_write_name(RemoteWritePolicy policy) {
  switch (policy) {
    case RemoteWritePolicy::Off: return "off";
    case RemoteWritePolicy::Shared: return "shared";
    case RemoteWritePolicy::All: return "all";
  }
  return "shared";
}

RemoteTier::RemoteTier(const RemoteTierOptions& options) : options_(options) {}

Status RemoteTier::open(const RemoteTierOptions& options, std::unique_ptr<RemoteTier>& ret) {
  auto tier = std::unique_ptr<RemoteTier>(new RemoteTier(options));
  if (tier->options_.chunk_bytes == 0) tier->options_.chunk_bytes = remote::chunk_bytes_default;
  tier->notify_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (tier->notify_fd_ < 0) return Status::IoError;
  for (Lane* lane : {&tier->checks_lane_, &tier->data_lane_}) {
    remote::ClientOptions client_options{.seeds = options.seeds,
                                         .user = options.user,
                                         .password = options.password,
                                         .io_timeout_msec = options.io_timeout_msec};
    lane->client = std::make_unique<remote::ClusterClient>(std::move(client_options));
    lane->store = std::make_unique<remote::RemoteStore>(*lane->client, tier->options_.chunk_bytes);
  }
  tier->stats_.nodes_known = options.seeds.size();
  for (Lane* lane : {&tier->checks_lane_, &tier->data_lane_}) {
    lane->thread = std::thread([t = tier.get(), lane] { t->run(*lane); });
  }
  tier->submit(Job{.kind = RemoteJobKind::Refresh});
  ret = std::move(tier);
  return Status::Ok;
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  for (Lane* lane : {&checks_lane_, &data_lane_}) {
    lane->wake.notify_all();
    if (lane->thread.joinable()) lane->thread.join();
  }
  if (notify_fd_ >= 0) close(notify_fd_);
}

bool RemoteTier::probing_useful() const {
  return up_.load(std::memory_order_relaxed) ||
         monotonic_usec() - last_failure_usec_.load(std::memory_order_relaxed) >= remote_down_retry_usec;
}

void RemoteTier::submit(Job&& job) {
  assert(job.kind != RemoteJobKind::Get && "gets are queued by get_all");
  job.start_usec = monotonic_usec();
  const bool check = job.kind == RemoteJobKind::Probe || job.kind == RemoteJobKind::Index ||
                     job.kind == RemoteJobKind::Refresh;
  {
    std::lock_guard lock(mutex_);
    (check ? checks_ : background_).push_back(std::move(job));
  }
  (check ? checks_lane_ : data_lane_).wake.notify_one();
}

bool RemoteTier::put(const remote::EntryKey& key, const remote::ManifestHeader& header,
                     const remote::ImageView& image, uint64_t tag, uint64_t tag2) {
  {
    std::lock_guard lock(mutex_);
    if (background_.size() >= remote_puts_queued_max) {
      ++stats_.puts_dropped;
      return false;
    }
    ++stats_.puts_pending;
  }
  submit(Job{.kind = RemoteJobKind::Put, .key = key, .header = header, .image = image, .tag = tag,
             .tag2 = tag2});
  return true;
}

void RemoteTier::probe(std::vector<remote::EntryKey> keys, uint64_t tag, uint64_t tag2) {
  submit(Job{.kind = RemoteJobKind::Probe, .keys = std::move(keys), .tag = tag, .tag2 = tag2});
}

void RemoteTier::probe_index(std::vector<remote::EntryKey> anchors, uint64_t tag, uint64_t tag2) {
  submit(Job{.kind = RemoteJobKind::Index, .keys = std::move(anchors), .tag = tag, .tag2 = tag2});
}

void RemoteTier::get(const remote::EntryKey& key, const remote::Manifest& manifest,
                     const remote::ImageTarget& target, uint64_t tag, uint64_t tag2) {
  get_all({{.key = key, .manifest = manifest, .target = target, .tag = tag, .tag2 = tag2}});
}

void RemoteTier::remove(const remote::EntryKey& key, uint32_t chunk_count) {
  submit(Job{.kind = RemoteJobKind::Remove, .key = key, .chunk_count = chunk_count});
}

void RemoteTier::get_all(std::vector<GetItem> items) {
  const uint64_t now = monotonic_usec();
  {
    std::lock_guard lock(mutex_);
    for (GetItem& g : items) {
      foreground_.push_back(Job{.kind = RemoteJobKind::Get, .key = g.key,
                                .manifest = std::move(g.manifest), .target = g.target,
                                .tag = g.tag, .tag2 = g.tag2, .start_usec = now});
    }
  }
  data_lane_.wake.notify_one();
}

size_t RemoteTier::puts_queued() const {
  std::lock_guard lock(mutex_);
  return background_.size();
}

void RemoteTier::take_jobs(Lane& lane, std::vector<Job>& ret) {
  std::deque<Job>* queue = &checks_;
  if (&lane == &data_lane_) queue = !foreground_.empty() ? &foreground_ : &background_;
  if (queue->empty()) return;
  ret.push_back(std::move(queue->front()));
  queue->pop_front();
  if (queue == &foreground_) take_batchable_gets(ret[0], ret);
}

void RemoteTier::run(Lane& lane) {
  std::vector<Job> jobs;
  jobs.reserve(remote::batched_gets_max);  // take_batchable_gets reads jobs[0] as it appends
  std::vector<RemoteCompletion> done;
  for (;;) {
    jobs.clear();
    {
      std::unique_lock lock(mutex_);
      lane.wake.wait(lock, [&] {
        if (!stopping_) take_jobs(lane, jobs);
        return stopping_ || !jobs.empty();
      });
      if (stopping_) return;
    }
    const uint64_t exec_start = monotonic_usec();
    done.clear();
    if (jobs.size() > 1) {
      execute_gets(lane, jobs, done);
    } else {
      done.push_back(execute(lane, jobs[0]));
    }
    // A batch's time is shared by its entries: what one of them cost.
    const uint64_t exec_usec = (monotonic_usec() - exec_start) / done.size();
    {
      std::lock_guard lock(mutex_);
      for (size_t i = 0; i < done.size(); ++i) {
        done[i].exec_usec = exec_usec;
        account(lane, done[i], exec_start - jobs[i].start_usec);
        if (done[i].kind != RemoteJobKind::Remove) done_.push_back(std::move(done[i]));
      }
    }
    const uint64_t one = 1;
    (void)!write(notify_fd_, &one, sizeof one);
  }
}

void RemoteTier::take_batchable_gets(const Job& first, std::vector<Job>& ret_more) {
  if (first.kind != RemoteJobKind::Get || !remote::batchable(first.manifest)) return;
  uint64_t bytes = first.manifest.image_bytes();
  while (!foreground_.empty() && ret_more.size() < remote::batched_gets_max) {
    const Job& next = foreground_.front();
    if (next.kind != RemoteJobKind::Get || !remote::batchable(next.manifest) ||
        bytes + next.manifest.image_bytes() > remote::batched_get_bytes_max) {
      break;
    }
    bytes += next.manifest.image_bytes();
    ret_more.push_back(std::move(foreground_.front()));
    foreground_.pop_front();
  }
}

void RemoteTier::execute_gets(Lane& lane, std::vector<Job>& jobs, std::vector<RemoteCompletion>& ret) {
  std::vector<remote::GetRequest> requests;
  for (const Job& j : jobs) requests.push_back({.key = j.key, .manifest = &j.manifest, .target = j.target});
  std::vector<Status> statuses;
  lane.store->get_batch(requests, statuses);
  bool reached = false;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& j = jobs[i];
    ret.push_back(RemoteCompletion{.kind = RemoteJobKind::Get,
                                   .status = statuses[i],
                                   .tag = j.tag,
                                   .tag2 = j.tag2,
                                   .start_usec = j.start_usec,
                                   .bytes = j.manifest.image_bytes(),
                                   .payload_checksum = j.manifest.header.payload_checksum});
    reached = reached || statuses[i] != Status::Unavailable;
  }
  note_reached(lane, reached);
}

void RemoteTier::account(Lane& lane, const RemoteCompletion& done, uint64_t queued_usec) {
  stats_.queue_latency.observe(queued_usec);
  // Each lane's store counts its own traffic; the tier's figures are their sums.
  lane.counted = lane.store->counters();
  lane.redirects = lane.client->redirects();
  const remote::StoreCounters& c = checks_lane_.counted;
  const remote::StoreCounters& d = data_lane_.counted;
  stats_.bytes_out = c.bytes_written + d.bytes_written;
  stats_.bytes_in = c.bytes_read + d.bytes_read;
  stats_.writes_refused = c.writes_refused + d.writes_refused;
  stats_.corrupt_values = c.corrupt_values + d.corrupt_values;
  stats_.redirects = checks_lane_.redirects + data_lane_.redirects;
  // The topology as the lane that ran last sees it.
  stats_.nodes_known = lane.client->nodes_known();
  stats_.nodes_up = lane.client->nodes_up();
  stats_.cluster = lane.client->cluster_mode();
  // An existence check or an index read: its keys, how many the store had, its time.
  const auto count_check = [&](const auto& results) {
    ++stats_.probes;
    stats_.probe_keys += done.keys.size();
    for (const auto& r : results) stats_.probe_hits += r.status == Status::Ok;
    stats_.probe_latency.observe(done.exec_usec);
  };
  switch (done.kind) {
    case RemoteJobKind::Put:
      ++(done.status == Status::Ok               ? stats_.puts
         : done.status == Status::AlreadyPresent ? stats_.puts_present
                                                 : stats_.puts_failed);
      stats_.put_latency.observe(done.exec_usec);
      assert(stats_.puts_pending > 0);
      --stats_.puts_pending;
      break;
    case RemoteJobKind::Probe:
      count_check(done.results);
      break;
    case RemoteJobKind::Index:
      count_check(done.indexes);
      break;
    case RemoteJobKind::Get:
      if (done.status == Status::Ok) {
        ++stats_.gets;
      } else if (done.status != Status::Corrupt) {
        ++stats_.get_failures;
      }
      stats_.get_latency.observe(done.exec_usec);
      break;
    case RemoteJobKind::Remove:
    case RemoteJobKind::Refresh: break;
  }
  if (done.status == Status::Unavailable && done.kind != RemoteJobKind::Refresh) ++stats_.errors;
}

void RemoteTier::note_reached(Lane& lane, bool reached) {
  // A cluster with some masters still connected is degraded (their keys are served,
  // the others miss), not down.
  reached = reached || (lane.client->cluster_mode() && lane.client->nodes_connected() > 0);
  up_.store(reached, std::memory_order_relaxed);
  if (!reached) last_failure_usec_.store(monotonic_usec(), std::memory_order_relaxed);
}

RemoteCompletion RemoteTier::execute(Lane& lane, Job& job) {
  RemoteCompletion done{.kind = job.kind, .tag = job.tag, .tag2 = job.tag2, .start_usec = job.start_usec};
  switch (job.kind) {
    case RemoteJobKind::Put:
      done.status = lane.store->put(job.key, job.header, job.image);
      done.bytes = job.image.tokens_bytes + job.image.payload_bytes;
      note_reached(lane, done.status != Status::Unavailable);
      break;
    case RemoteJobKind::Probe: {
      lane.store->probe(job.keys, done.results);
      bool reached = job.keys.empty();
      for (const remote::ProbeResult& r : done.results) reached = reached || r.status != Status::Unavailable;
      note_reached(lane, reached);
      done.status = reached ? Status::Ok : Status::Unavailable;
      done.keys = std::move(job.keys);
      break;
    }
    case RemoteJobKind::Index: {
      lane.store->probe_index(job.keys, done.indexes);
      bool reached = job.keys.empty();
      for (const remote::IndexResult& r : done.indexes) reached = reached || r.status != Status::Unavailable;
      note_reached(lane, reached);
      done.status = reached ? Status::Ok : Status::Unavailable;
      done.keys = std::move(job.keys);
      break;
    }
    case RemoteJobKind::Get:
      done.status = lane.store->get(job.key, job.manifest, job.target);
      done.bytes = job.manifest.image_bytes();
      done.payload_checksum = job.manifest.header.payload_checksum;
      note_reached(lane, done.status != Status::Unavailable);
      break;
    case RemoteJobKind::Remove:
      lane.store->remove(job.key, job.chunk_count);
      break;
    case RemoteJobKind::Refresh:
      done.status = lane.client->refresh();
      note_reached(lane, done.status == Status::Ok);
      break;
  }
  return done;
}

void RemoteReadModel::observe(uint64_t bytes, uint64_t exec_usec) {
  auto ewma = [](double& figure, double sample) {
    figure = figure <= 0 ? sample : 0.7 * figure + 0.3 * sample;
  };
  const auto usec = static_cast<double>(std::max<uint64_t>(exec_usec, 1));
  if (bytes >= remote_bandwidth_sample_bytes_min) {
    ewma(bytes_per_second_, static_cast<double>(bytes) * 1e6 / usec);
    return;
  }
  const double transfer_usec =
      bytes_per_second_ > 0 ? static_cast<double>(bytes) * 1e6 / bytes_per_second_ : 0;
  double sample = std::max(usec - transfer_usec, 1.0);
  // One stall (a busy machine, a page fault storm) must not stop the next lookups from
  // promoting: a sample counts at most twice the estimate, so a lasting slowdown takes
  // a few restores to be believed.
  if (latency_usec_ > 0) sample = std::min(sample, 2 * latency_usec_);
  ewma(latency_usec_, sample);
}

double RemoteReadModel::load_seconds(uint64_t bytes) const {
  const double transfer = bytes_per_second_ > 0 ? static_cast<double>(bytes) / bytes_per_second_ : 0;
  return latency_usec_ * 1e-6 + transfer;
}

void RemoteTier::take_completions(std::vector<RemoteCompletion>& ret) {
  uint64_t count = 0;
  (void)!read(notify_fd_, &count, sizeof count);
  ret.clear();
  {
    std::lock_guard lock(mutex_);
    ret.swap(done_);
  }
  for (const RemoteCompletion& d : ret) {
    if (d.kind == RemoteJobKind::Get && d.status == Status::Ok) read_model_.observe(d.bytes, d.exec_usec);
  }
  const bool up = up_.load(std::memory_order_relaxed);
  if (!ret.empty() && (!logged_once_ || up != logged_up_)) {
    // One line per state change, not per failed job.
    if (up) {
      log_notice("kvparkd: remote tier %s reachable", seeds_text().c_str());
    } else {
      log_warning("kvparkd: remote tier %s unreachable; lookups miss it, writes are skipped, "
                  "retrying every %llu ms",
                  seeds_text().c_str(), static_cast<unsigned long long>(remote_down_retry_usec / 1000));
    }
    std::lock_guard lock(mutex_);
    ++stats_.state_changes;
    logged_up_ = up;
    logged_once_ = true;
  }
}

RemoteTierStats RemoteTier::stats() const {
  std::lock_guard lock(mutex_);
  RemoteTierStats s = stats_;
  s.up = up_.load(std::memory_order_relaxed);
  return s;
}

bool RemoteTier::missed_recently(const Hash128& hash, uint64_t now_usec) const {
  auto it = missed_.find(hash);
  return it != missed_.end() && now_usec - it->second < remote_miss_memory_usec;
}

void RemoteTier::note_missed(const Hash128& hash, uint64_t now_usec) {
  if (missed_.size() >= remote_misses_remembered_max) {
    std::erase_if(missed_, [&](const auto& m) { return now_usec - m.second >= remote_miss_memory_usec; });
    if (missed_.size() >= remote_misses_remembered_max) missed_.clear();
  }
  missed_[hash] = now_usec;
}

void RemoteTier::note_probe(uint64_t tag, uint64_t tag2, uint64_t now_usec) {
  probes_out_.push_back({.tag = tag, .tag2 = tag2, .deadline_usec = now_usec + remote_probe_budget_usec});
}

void RemoteTier::take_expired_probes(uint64_t now_usec,
                                     std::vector<std::pair<uint64_t, uint64_t>>& ret) {
  ret.clear();
  while (!probes_out_.empty() && probes_out_.front().deadline_usec <= now_usec) {
    ret.emplace_back(probes_out_.front().tag, probes_out_.front().tag2);
    probes_out_.pop_front();
  }
}

std::string RemoteTier::seeds_text() const {
  std::string s = "redis://";
  for (size_t i = 0; i < options_.seeds.size(); ++i) {
    if (i > 0) s += ",";
    s += options_.seeds[i].host + ":" + std::to_string(options_.seeds[i].port);
  }
  return s;
}

}  // namespace kvpark::daemon
