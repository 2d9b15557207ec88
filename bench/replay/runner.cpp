// The coordinator (see runner.h). Single-threaded, so forking engines at any time
// is safe; it holds a libkvpark connection only while reading stats.
#include "bench/replay/runner.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include <httplib.h>
#include <rapidjson/document.h>

#include "bench/replay/content.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/redis_process.h"

namespace kvpark::replay {
namespace {

constexpr int daemon_start_timeout_msec = 30'000;
constexpr double spill_settle_timeout_ms = 20'000;
constexpr double spill_stable_ms = 1'000;  // disk_entries unchanged this long: spills settled
constexpr double drain_timeout_ms = 120'000;
constexpr double remote_settle_timeout_ms = 30'000;
constexpr double remote_settle_poll_ms = 5;

double now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

uint64_t now_nsec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// The replay's kvparkd (tests/testing/daemon_process.h), in the work directory so
// that --keep keeps its log and disk tier; killed with the replayer.
class Daemon {
 public:
  // `remote_seeds`: "redis://host:port" for a two-host run (HTTP status on too), or "".
  Daemon(const RunOptions& o, const std::string& dir, const std::string& remote_seeds = "",
         const std::string& label = "replay")
      : options_(o), process_(config(o, dir, remote_seeds, label)) {}
  ~Daemon() {
    if (process_.running()) process_.stop();
  }

  const std::string& socket_path() const { return process_.socket_path(); }
  std::string log_tail() const { return process_.log_tail(); }

  // Starts it, or starts it again after kill_hard() on the same socket, arena name
  // and disk directory.
  bool start(std::string& ret_error) {
    if (process_.start()) return true;
    ret_error = "kvparkd (" + options_.kvparkd + ") did not become ready";
    return false;
  }
  void kill_hard() { process_.kill_hard(); }

  // The numbers of its /v1/status (two-host runs, which turn HTTP on); false when unreadable.
  bool http_status(std::map<std::string, uint64_t>& ret) const {
    if (process_.http_port() <= 0) return false;
    httplib::Client http("127.0.0.1", process_.http_port());
    auto res = http.Get("/v1/status");
    if (!res || res->status != 200) return false;
    rapidjson::Document d;
    d.Parse(res->body.c_str());
    if (d.HasParseError() || !d.IsObject()) return false;
    ret.clear();
    for (const auto& m : d.GetObject()) {
      if (m.value.IsUint64()) ret[m.name.GetString()] = m.value.GetUint64();
    }
    return true;
  }

  bool stats(kvpark_stats& ret) const {
    kvpark_namespace ns{};
    ns.id = {options_.engine.namespace_low ^ 0x5354415453ull, 1};  // its own: not the engines'
    ns.block_tokens = 64;
    ns.block_payload_bytes = 4096;
    ns.client_name = "kvpark-replay-stats";
    kvpark_client* c = nullptr;
    if (kvpark_connect(socket_path().c_str(), &ns, &c) != KVPARK_OK) return false;
    const bool ok = kvpark_get_stats(c, &ret) == KVPARK_OK;
    kvpark_disconnect(c);
    return ok;
  }

 private:
  static testing::DaemonConfig config(const RunOptions& o, const std::string& dir,
                                      const std::string& remote_seeds, const std::string& label) {
    std::vector<std::string> args;
    if (o.disk) {
      std::filesystem::create_directories(dir + "/disk");
      args = {"--disk-dir", dir + "/disk", "--spill-on-shutdown=false"};
    }
    if (!remote_seeds.empty()) {
      args.insert(args.end(), {"--remote", remote_seeds, "--http-listen", "127.0.0.1:0"});
    }
    return {.arena_bytes = o.arena_bytes,
            .extra_args = args,
            .kvparkd = o.kvparkd,
            .directory = dir,
            .label = label,
            .ready_timeout_msec = daemon_start_timeout_msec,
            .die_with_parent = true};
  }

  const RunOptions& options_;
  testing::DaemonProcess process_;
};

struct EngineProc {
  pid_t pid = -1;
  int job_fd = -1;
  int result_fd = -1;
  int outstanding = 0;
};

class Coordinator {
 public:
  // daemons[0] is host A (restarts and stats are its), daemons[1] host B if any.
  Coordinator(const std::vector<Event>& events, const RunOptions& o, const std::vector<Daemon*>& daemons,
              RunOutcome& out)
      : events_(events), options_(o), daemons_(daemons), daemon_(*daemons[0]), out_(out) {}

  ~Coordinator() {
    for (EngineProc& e : engines_) stop_engine(e);
  }

  bool run(std::string& ret_error) {
    uint32_t engines = 0;
    for (const Event& e : events_) engines = std::max(engines, e.engine + 1);
    engines_.resize(engines);
    for (uint32_t i = 0; i < engines; ++i) {
      EngineConfig c = options_.engine;
      const uint32_t host = host_of(i);
      c.socket_path = daemons_[host]->socket_path();
      // Each host's engines run one after another in a two-host run, so what is in
      // flight at a lookup is the remote tier (a restore, or an existence check).
      c.inflight_is_remote = options_.two_hosts;
      engine_configs_.push_back(std::move(c));
    }
    for (uint32_t i = 0; i < engines; ++i) start_engine(i);
    request_of_event_.assign(events_.size(), SIZE_MAX);
    bool daemon_restarted = false;
    std::vector<bool> engine_was_restarted(engines, false);
    double start = now_ms();
    for (size_t i = 0; i < events_.size(); ++i) {
      const Event& ev = events_[i];
      const double due = start + ev.t_ms * options_.engine.time_scale;
      while (now_ms() < due) {
        if (!pump(due - now_ms(), ret_error)) return false;
      }
      if (ev.kind == EventKind::RestartEngine) {
        if (!drain([&] { return engines_[ev.engine].outstanding == 0; }, ret_error)) return false;
        stop_engine(engines_[ev.engine], true);
        start_engine(ev.engine);
        engine_was_restarted[ev.engine] = true;
        continue;
      }
      if (ev.kind == EventKind::RestartDaemon) {
        if (!drain([&] { return all_idle(); }, ret_error)) return false;
        settle_spills();
        daemon_.kill_hard();
        // Only what reached the disk tier survives a SIGKILL.
        for (auto it = parked_.begin(); it != parked_.end();) {
          it = it->second ? std::next(it) : parked_.erase(it);
        }
        if (!daemon_.start(ret_error)) return false;
        kvpark_stats s{};
        if (daemon_.stats(s)) out_.disk_entries_after_restart = s.disk_entries;
        daemon_restarted = true;
        continue;
      }
      if (host_of(ev.engine) > 0) {
        // The trace's clock stops meanwhile: later requests keep their spacing.
        const double settle_start = now_ms();
        if (!settle_remote_writes(ret_error)) return false;
        start += now_ms() - settle_start;
      }
      RequestRecord rec;
      rec.event = i;
      std::string error;
      if (!render_request(ev.body, options_.engine.automatic_system_candidate, rec.reference, error)) {
        ret_error = "event " + std::to_string(i) + ": " + error;
        return false;
      }
      rec.expected_cached = deepest_parked(rec.reference.tokens);
      rec.after_engine_restart = engine_was_restarted[ev.engine];
      rec.after_daemon_restart = daemon_restarted;
      if (ev.stats) {
        if (!drain([&] { return all_idle(); }, ret_error)) return false;
        rec.has_stats = daemon_.stats(rec.stats_before);
      }
      request_of_event_[i] = out_.requests.size();
      out_.requests.push_back(std::move(rec));
      const Job job{.request = static_cast<uint32_t>(i), .dispatched_nsec = now_nsec()};
      EngineProc& engine = engines_[ev.engine];
      if (write(engine.job_fd, &job, sizeof job) != static_cast<ssize_t>(sizeof job)) {
        ret_error = "engine " + std::to_string(ev.engine) + " is gone";
        return false;
      }
      ++engine.outstanding;
      if (ev.stats) {
        if (!drain([&] { return all_idle(); }, ret_error)) return false;
        RequestRecord& r = out_.requests[request_of_event_[i]];
        r.has_stats = daemon_.stats(r.stats_after) && r.has_stats;
      }
    }
    if (!drain([&] { return all_idle(); }, ret_error)) return false;
    out_.wall_real_ms = now_ms() - start;
    daemon_.stats(out_.final_stats);
    for (const Daemon* d : daemons_) {
      out_.host_status.emplace_back();
      if (options_.two_hosts) d->http_status(out_.host_status.back());
    }
    return true;
  }

 private:
  uint32_t host_of(uint32_t engine) const {
    return options_.two_hosts && engine < options_.engine_host.size() && options_.engine_host[engine] > 0 ? 1 : 0;
  }

  // Two hosts: A's engines idle and every write-behind A accepted finished (written,
  // present or failed), so B's lookup finds in the store all A will have put there.
  bool settle_remote_writes(std::string& ret_error) {
    const double start = now_ms();
    if (!drain([&] {
          for (size_t e = 0; e < engines_.size(); ++e) {
            if (host_of(static_cast<uint32_t>(e)) == 0 && engines_[e].outstanding > 0) return false;
          }
          return true;
        }, ret_error)) {
      return false;
    }
    std::map<std::string, uint64_t> s;
    while (!daemon_.http_status(s) || s["remote_writes_pending"] > 0) {
      if (now_ms() - start > remote_settle_timeout_ms) {
        return ret_error = "host A's write-behinds did not settle in time", false;
      }
      if (!pump(remote_settle_poll_ms, ret_error)) return false;
    }
    out_.remote_settle_ms += now_ms() - start;
    return true;
  }
  bool all_idle() const {
    return std::all_of(engines_.begin(), engines_.end(), [](const EngineProc& e) { return e.outstanding == 0; });
  }

  template <typename Done>
  bool drain(Done done, std::string& ret_error) {
    const double deadline = now_ms() + drain_timeout_ms;
    while (!done()) {
      if (now_ms() > deadline) return ret_error = "engines did not finish in time", false;
      if (!pump(100, ret_error)) return false;
    }
    return true;
  }

  // Waits up to timeout_ms for results and records them.
  bool pump(double timeout_ms, std::string& ret_error) {
    std::vector<pollfd> fds;
    for (const EngineProc& e : engines_) fds.push_back({.fd = e.result_fd, .events = POLLIN, .revents = 0});
    const int n = poll(fds.data(), fds.size(), std::max(0, static_cast<int>(timeout_ms)));
    if (n <= 0) return true;
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP)) == 0) continue;
      Result r;
      const ssize_t got = read(fds[i].fd, &r, sizeof r);
      if (got != static_cast<ssize_t>(sizeof r)) {
        ret_error = "engine " + std::to_string(i) + " died";
        return false;
      }
      --engines_[i].outstanding;
      RequestRecord& rec = out_.requests[request_of_event_[r.request]];
      rec.result = r;
      rec.done = true;
      note_parked(rec);
    }
    return true;
  }

  // What the engine reports parked, by prefix key; `true` when shared (written
  // through to disk at SEAL, so it survives a daemon SIGKILL once spilled).
  void note_parked(const RequestRecord& rec) {
    const std::vector<uint64_t> keys = prefix_keys(options_.engine.namespace_low, rec.reference.tokens);
    for (uint32_t i = 0; i < rec.result.published_count; ++i) {
      const uint32_t p = rec.result.published_position[i];
      if (p >= keys.size()) continue;
      const bool shared = rec.result.published_shared[i] != 0;
      bool& slot = parked_[keys[p]];
      slot = slot || shared;
      if (shared) {
        durable_.insert(keys[p]);
        for (uint32_t b = 1; b * options_.engine.block_tokens <= p; ++b) {
          durable_.insert(keys[b * options_.engine.block_tokens] ^ 0xb10c);
        }
      }
    }
  }

  uint32_t deepest_parked(const std::vector<int32_t>& tokens) const {
    const std::vector<uint64_t> keys = prefix_keys(options_.engine.namespace_low, tokens);
    for (size_t p = tokens.size() - 1; p > 0; --p) {
      if (parked_.count(keys[p]) != 0) return static_cast<uint32_t>(p);
    }
    return 0;
  }

  // Polls the daemon until its disk entries cover what was written through, or stop changing.
  void settle_spills() {
    out_.durable_entries_expected = durable_.size();
    const double deadline = now_ms() + spill_settle_timeout_ms;
    uint64_t last = UINT64_MAX;
    double stable_since = now_ms();
    kvpark_stats s{};
    while (now_ms() < deadline) {
      if (daemon_.stats(s)) {
        if (s.disk_entries != last) {
          last = s.disk_entries;
          stable_since = now_ms();
        }
        if (s.disk_entries >= durable_.size() && now_ms() - stable_since > 200) break;
        if (now_ms() - stable_since > spill_stable_ms) break;
      }
      usleep(50'000);
    }
    out_.disk_entries_before_kill = s.disk_entries;
  }

  void start_engine(uint32_t index) {
    int jobs[2], results[2];
    if (pipe2(jobs, O_CLOEXEC) != 0 || pipe2(results, O_CLOEXEC) != 0) abort();
    EngineProc& e = engines_[index];
    e.pid = fork();
    if (e.pid == 0) {
      for (const EngineProc& other : engines_) {
        if (other.job_fd >= 0) close(other.job_fd);
        if (other.result_fd >= 0) close(other.result_fd);
      }
      close(jobs[1]);
      close(results[0]);
      engine_main(engine_configs_[index], events_, index, jobs[0], results[1]);
    }
    close(jobs[0]);
    close(results[1]);
    e.job_fd = jobs[1];
    e.result_fd = results[0];
    e.outstanding = 0;
  }

  // Ends an engine: closing its job pipe lets it exit; `hard` kills it at once.
  void stop_engine(EngineProc& e, bool hard = false) {
    if (e.pid <= 0) return;
    if (hard) kill(e.pid, SIGKILL);
    close(e.job_fd);
    waitpid(e.pid, nullptr, 0);
    close(e.result_fd);
    e = EngineProc{};
  }

  const std::vector<Event>& events_;
  const RunOptions& options_;
  std::vector<EngineConfig> engine_configs_;  // per engine: its host's socket
  std::vector<Daemon*> daemons_;
  Daemon& daemon_;
  RunOutcome& out_;
  std::vector<EngineProc> engines_;
  std::vector<size_t> request_of_event_;
  std::unordered_map<uint64_t, bool> parked_;
  std::unordered_set<uint64_t> durable_;
};

}  // namespace

RunOutcome run_trace(const std::vector<Event>& events, const RunOptions& options) {
  RunOutcome out;
  char templ[] = "/var/tmp/kvpark-replay-XXXXXX";  // a real file system: O_DIRECT for the disk tier
  if (mkdtemp(templ) == nullptr) {
    out.error = std::string("mkdtemp: ") + strerror(errno);
    return out;
  }
  const std::string dir = templ;
  if (!options.two_hosts) {
    Daemon daemon(options, dir);
    if (daemon.start(out.error)) {
      Coordinator coordinator(events, options, {&daemon}, out);
      out.ok = coordinator.run(out.error);
    }
    if (!out.ok) out.error += "\nkvparkd log tail:\n" + daemon.log_tail();
  } else if (testing::redis_server_path().empty()) {
    out.skipped = true;
    out.error = "redis-server is not installed (the two hosts' remote tier)";
  } else {
    // One store, two hosts: each daemon in its own directory (socket, log, arena name, disk).
    testing::RedisProcess redis;
    std::filesystem::create_directories(dir + "/host-a");
    std::filesystem::create_directories(dir + "/host-b");
    if (!redis.start()) {
      out.error = "redis-server did not start:\n" + redis.log_tail();
    } else {
      const std::string seeds = "redis://" + redis.address();
      Daemon a(options, dir + "/host-a", seeds, "replay-a");
      Daemon b(options, dir + "/host-b", seeds, "replay-b");
      if (a.start(out.error) && b.start(out.error)) {
        Coordinator coordinator(events, options, {&a, &b}, out);
        out.ok = coordinator.run(out.error);
      }
      if (!out.ok) {
        out.error += "\nhost A kvparkd log tail:\n" + a.log_tail() + "\nhost B kvparkd log tail:\n" + b.log_tail();
      }
    }
  }
  if (!options.keep_work_dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return out;
}

}  // namespace kvpark::replay
