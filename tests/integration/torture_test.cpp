// Seeded, time-bounded torture against a real kvparkd and real engine processes
// (kvpark-test-engine): engines SIGKILLed at random points of publish and restore,
// and the daemon itself SIGKILLed in a loop while publishers are mid-publish and
// spills are in flight, on a mixed workload (shared heads, private turns behind
// them). After every restart every known prompt is looked up and every restored byte
// checked; the tests fail if nothing restores at all. Under a service manager that keeps
// the arena (the harness's fd store), with the disk tier on a small arena so that kills
// also land mid-seal, mid-eviction and mid-spill, every entry sealed on the host before
// each kill is adopted.
//
// The seed is printed; KVPARK_TORTURE_SEED=N reruns a failure, KVPARK_TORTURE_SECONDS
// sets how long each test runs (default 20).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "shm/state_segment.h"
#include "tests/testing/content.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t block_tokens = 64;    // kvpark-test-engine's default
constexpr uint64_t block_bytes = 256 * 1024;  // a few prompts fill the arena: demotions, evictions
constexpr kvpark_hash128 engine_ns{1, 0};  // kvpark-test-engine's default --ns 1
constexpr uint32_t head_tokens = 512;    // 8 blocks, shared by many prompts
constexpr int heads = 4;
constexpr size_t engines_in_flight = 4;

uint64_t torture_seed() {
  if (const char* s = std::getenv("KVPARK_TORTURE_SEED")) return std::strtoull(s, nullptr, 0);
  return std::random_device{}();
}

uint64_t torture_msec() {
  if (const char* s = std::getenv("KVPARK_TORTURE_SECONDS")) return std::strtoull(s, nullptr, 0) * 1000;
  return 20'000;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Prompt {
  uint64_t head_seed = 0;
  uint64_t body_seed = 0;
  uint32_t body_tokens = 0;
  bool shared = false;
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> t = make_tokens(head_seed, head_tokens);
    const std::vector<int32_t> body = make_tokens(body_seed, body_tokens);
    t.insert(t.end(), body.begin(), body.end());
    return t;
  }
  std::vector<std::string> engine_args(uint64_t session) const {
    std::vector<std::string> a = {"--block-bytes", std::to_string(block_bytes), "--head-seed",
                                  std::to_string(head_seed), "--head-tokens",
                                  std::to_string(head_tokens), "--body-seed",
                                  std::to_string(body_seed), "--body-tokens",
                                  std::to_string(body_tokens), "--session",
                                  std::to_string(session)};
    if (shared) a.push_back("--shared");
    return a;
  }
};

// A mixed workload: shared heads published as such, and private turns behind them
// (which park the head as private first, half of the time).
Prompt random_prompt(std::mt19937_64& rng) {
  Prompt p;
  p.head_seed = 5000 + rng() % heads;
  p.shared = rng() % 3 == 0;
  if (!p.shared) {
    p.body_seed = 100'000 + rng() % 64;
    p.body_tokens = static_cast<uint32_t>(64 + rng() % 384);
  }
  return p;
}

struct Figures {
  uint64_t lookups = 0;
  uint64_t hits = 0;             // lookups that restored something
  uint64_t blocks_verified = 0;  // byte for byte
  uint64_t wrong_blocks = 0;

  void add(const Figures& f) {
    lookups += f.lookups;
    hits += f.hits;
    blocks_verified += f.blocks_verified;
    wrong_blocks += f.wrong_blocks;
  }
};

// Looks every prompt up (waiting for promotions) and checks every restored block.
Figures verify_all(const std::string& socket, const std::vector<Prompt>& prompts) {
  Figures f;
  kvpark_namespace ns{};
  ns.id = engine_ns;
  ns.block_tokens = block_tokens;
  ns.block_payload_bytes = block_bytes;
  ns.client_name = "torture-verifier";
  kvpark_client* client = nullptr;
  EXPECT_EQ(kvpark_connect(socket.c_str(), &ns, &client), KVPARK_OK);
  if (client == nullptr) return f;
  for (const Prompt& p : prompts) {
    const std::vector<int32_t> tokens = p.tokens();
    std::vector<kvpark_hash128> hashes(tokens.size() / block_tokens);
    kvpark_chain_hashes(engine_ns, tokens.data(), block_tokens, hashes.size(), hashes.data());
    kvpark_plan* plan = nullptr;
    const kvpark_status s = kvpark_lookup(client, 999, tokens.data(), tokens.size(), &plan);
    EXPECT_EQ(s, KVPARK_OK);
    if (s != KVPARK_OK) continue;
    if (kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan)) {
      const kvpark_status w = kvpark_plan_wait(plan, 10'000);
      EXPECT_TRUE(w == KVPARK_OK || w == KVPARK_TIMEOUT) << kvpark_status_string(w);
    }
    ++f.lookups;
    if (kvpark_plan_restorable_tokens(plan) > 0) ++f.hits;
    for (size_t i = 0; i < kvpark_plan_block_count(plan); ++i) {
      ++f.blocks_verified;
      if (!payload_matches(payload_key(hashes[i]), kvpark_plan_block(plan, i), block_bytes)) {
        ++f.wrong_blocks;
      }
    }
    kvpark_plan_release(plan);
  }
  kvpark_disconnect(client);
  return f;
}

// Engine processes kept in flight, each killed at a random point or left to finish.
class EngineSwarm {
 public:
  EngineSwarm(std::mt19937_64& rng, std::vector<Prompt>& prompts) : rng_(rng), prompts_(prompts) {}
  ~EngineSwarm() { kill_all(); }

  // Tops the swarm up and reaps or kills what is due. kill_share: out of 100.
  void step(const std::string& socket, int kill_share) {
    while (running_.size() < engines_in_flight) {
      const Prompt p = random_prompt(rng_);
      const bool publish = rng_() % 3 != 0;
      std::vector<std::string> args = p.engine_args(1 + rng_() % 1000);
      args.push_back("--wait-msec");
      args.push_back("2000");
      args.push_back(publish ? "publish" : "verify");
      auto r = std::make_unique<Running>(spawn_process(engine_argv(socket, args)));
      r->kill_at_msec = static_cast<int>(rng_() % 100) < kill_share ? now_msec() + rng_() % 40 : 0;
      if (publish) prompts_.push_back(p);
      running_.push_back(std::move(r));
    }
    for (size_t i = 0; i < running_.size();) {
      Running& r = *running_[i];
      int status = 0;
      if (r.kill_at_msec != 0 && now_msec() >= r.kill_at_msec) {
        r.child.kill_hard();
        ++kills;
      } else if (waitpid(r.child.pid, &status, WNOHANG) == r.child.pid) {
        r.child.pid = -1;
        // 3: a restorer found bytes that differ (kvpark-test-engine's exit codes).
        if (WIFEXITED(status) && WEXITSTATUS(status) == 3) ++wrong_restores;
        ++finished;
      } else {
        ++i;
        continue;
      }
      running_[i] = std::move(running_.back());
      running_.pop_back();
    }
  }
  void kill_all() {
    for (auto& r : running_) {
      if (r->child.pid > 0) {
        r->child.kill_hard();
        ++kills;
      }
    }
    running_.clear();
  }

  uint64_t kills = 0;
  uint64_t finished = 0;
  uint64_t wrong_restores = 0;

 private:
  struct Running {
    explicit Running(ChildProcess&& c) : child(std::move(c)) {}
    ChildProcess child;
    uint64_t kill_at_msec = 0;  // 0: left to finish
  };
  std::mt19937_64& rng_;
  std::vector<Prompt>& prompts_;
  std::vector<std::unique_ptr<Running>> running_;
};

// The known prompts, each once.
std::vector<Prompt> distinct(const std::vector<Prompt>& prompts) {
  std::vector<Prompt> out;
  for (const Prompt& p : prompts) {
    bool seen = false;
    for (const Prompt& q : out) {
      seen = seen || (q.head_seed == p.head_seed && q.body_seed == p.body_seed &&
                      q.body_tokens == p.body_tokens);
    }
    if (!seen) out.push_back(p);
  }
  return out;
}

class Torture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty() || built_binary("KVPARK_TEST_ENGINE").empty()) {
      GTEST_SKIP() << "KVPARKD / KVPARK_TEST_ENGINE not set; run through meson test";
    }
    seed_ = torture_seed();
    printf("torture seed %llu (rerun: KVPARK_TORTURE_SEED=%llu)\n",
           static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(seed_));
    rng_.seed(seed_);
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

TEST_F(Torture, EnginesKilledAtRandomPointsOfPublishAndRestore) {
  DaemonProcess daemon(DaemonConfig{.arena_bytes = 64ull << 20});
  ASSERT_TRUE(daemon.start()) << read_file(daemon.log_path());
  std::vector<Prompt> prompts;
  EngineSwarm swarm(rng_, prompts);
  const uint64_t deadline = now_msec() + torture_msec();
  uint64_t rounds = 0;
  while (now_msec() < deadline) {
    swarm.step(daemon.socket_path(), 60);
    if (++rounds % 50 == 0) usleep(1000);
  }
  swarm.kill_all();
  // Every dead engine's leases and reservations are gone.
  StatsClient stats(daemon.socket_path());
  kvpark_stats s{};
  EXPECT_TRUE(stats.wait_until(
      [](const kvpark_stats& st) { return st.connections == 1 && st.leases == 0 && st.reservations == 0; },
      10'000, &s))
      << "connections=" << s.connections << " leases=" << s.leases << " reservations=" << s.reservations;
  const Figures f = verify_all(daemon.socket_path(), distinct(prompts));
  printf("engine torture, seed %llu: %llu engines finished, %llu killed; %llu lookups, %llu hits, "
         "%llu blocks verified, %llu wrong (and %llu wrong restores seen by engines)\n",
         static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(swarm.finished),
         static_cast<unsigned long long>(swarm.kills), static_cast<unsigned long long>(f.lookups),
         static_cast<unsigned long long>(f.hits), static_cast<unsigned long long>(f.blocks_verified),
         static_cast<unsigned long long>(f.wrong_blocks),
         static_cast<unsigned long long>(swarm.wrong_restores));
  EXPECT_GT(swarm.kills, 0u);
  EXPECT_GT(f.hits, 0u) << "a run that restores nothing proves nothing";
  EXPECT_EQ(f.wrong_blocks, 0u);
  EXPECT_EQ(swarm.wrong_restores, 0u);
  EXPECT_EQ(daemon.stop(), 0);
}

// Record files in the disk tier's directory (interrupted writes end in .tmp).
size_t record_files(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    n += e.is_regular_file() && e.path().extension() == ".kvr" ? 1 : 0;
  }
  return n;
}

TEST_F(Torture, DaemonKilledInALoopWhilePublishersPublishAndSpillsRun) {
  char templ[] = "/var/tmp/kvpark-torture-XXXXXX";
  const std::string disk = mkdtemp(templ);
  std::vector<Prompt> prompts;
  Figures total;
  uint64_t cycles = 0, daemon_kills = 0, engine_kills = 0, records_max = 0;
  const uint64_t deadline = now_msec() + torture_msec();
  while (now_msec() < deadline || cycles < 2) {
    DaemonProcess daemon(DaemonConfig{.arena_bytes = 16ull << 20, .extra_args = {"--disk-dir", disk}});
    ASSERT_TRUE(daemon.start()) << read_file(daemon.log_path());
    if (cycles == 0 && read_file(daemon.log_path()).find("disk tier off") != std::string::npos) {
      GTEST_SKIP() << "no disk tier here: " << read_file(daemon.log_path());
    }
    // After a crash: every record on disk is indexed (reachable) or was removed.
    StatsClient stats(daemon.socket_path());
    kvpark_stats s{};
    // Removals of unreachable records are asynchronous unlinks.
    (void)wait_until([&] { return s = stats.get(), record_files(disk) == s.disk_entries; }, 10'000);
    EXPECT_EQ(record_files(disk), s.disk_entries)
        << "cycle " << cycles << ": a record on disk is neither reachable nor removed\n"
        << read_file(daemon.log_path());
    records_max = std::max<uint64_t>(records_max, s.disk_entries);
    // Every known prompt, byte for byte.
    const Figures f = verify_all(daemon.socket_path(), distinct(prompts));
    total.add(f);
    EXPECT_EQ(f.wrong_blocks, 0u) << "cycle " << cycles;
    // Publishers mid-publish, spills in flight, then kill -9.
    EngineSwarm swarm(rng_, prompts);
    const uint64_t kill_at = now_msec() + 400 + rng_() % 1200;
    while (now_msec() < kill_at) {
      swarm.step(daemon.socket_path(), 10);
      usleep(1000);
    }
    daemon.kill_hard();
    ++daemon_kills;
    swarm.kill_all();
    engine_kills += swarm.kills;
    EXPECT_EQ(swarm.wrong_restores, 0u);
    ++cycles;
  }
  // One last restart to check what the last kill left.
  {
    DaemonProcess daemon(DaemonConfig{.arena_bytes = 16ull << 20, .extra_args = {"--disk-dir", disk}});
    ASSERT_TRUE(daemon.start()) << read_file(daemon.log_path());
    StatsClient stats(daemon.socket_path());
    kvpark_stats s{};
    (void)wait_until([&] { return s = stats.get(), record_files(disk) == s.disk_entries; });
    EXPECT_EQ(record_files(disk), s.disk_entries);
    const Figures f = verify_all(daemon.socket_path(), distinct(prompts));
    total.add(f);
    records_max = std::max<uint64_t>(records_max, s.disk_entries);
    EXPECT_EQ(daemon.stop(), 0);
  }
  printf("daemon torture, seed %llu: %llu cycles, %llu daemon kills, %llu engine kills, up to "
         "%llu records recovered; %llu lookups, %llu hits, %llu blocks verified, %llu wrong\n",
         static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(cycles),
         static_cast<unsigned long long>(daemon_kills), static_cast<unsigned long long>(engine_kills),
         static_cast<unsigned long long>(records_max), static_cast<unsigned long long>(total.lookups),
         static_cast<unsigned long long>(total.hits),
         static_cast<unsigned long long>(total.blocks_verified),
         static_cast<unsigned long long>(total.wrong_blocks));
  EXPECT_GT(total.hits, 0u) << "a run that restores nothing after restarts proves nothing";
  EXPECT_GT(records_max, 0u);
  EXPECT_EQ(total.wrong_blocks, 0u);
  std::error_code ec;
  fs::remove_all(disk, ec);
}

// Valid records in the state segment the manager keeps: the entries sealed on the host
// at this instant (a record being written or cleared is not valid).
uint64_t sealed_records(int state_fd) {
  std::unique_ptr<shm::StateSegment> segment;
  int err = 0;
  if (state_fd < 0 || shm::StateSegment::adopt(dup(state_fd), segment, err) != Status::Ok) return 0;
  uint64_t valid = 0;
  shm::StateRecord r{};
  for (uint64_t i = 0; i < segment->records_high_water(); ++i) {
    valid += segment->check_record(i, r) == shm::StateSegment::RecordCheck::Valid;
  }
  return valid;
}

// How many entries the daemon's last start adopted, from its log (0: none).
uint64_t last_adopted(const std::string& log) {
  const std::string needle = "kvparkd: adopted ";
  const size_t at = log.rfind(needle);
  if (at == std::string::npos) return 0;
  return std::strtoull(log.c_str() + at + needle.size(), nullptr, 10);
}

// With the disk tier on a small arena, so that kills land mid-seal, mid-eviction and
// mid-spill as well as mid-publish and mid-restore.
TEST_F(Torture, DaemonKilledInALoopAdoptsEveryEntrySealedBeforeTheKill) {
  char templ[] = "/var/tmp/kvpark-torture-XXXXXX";
  const std::string disk = mkdtemp(templ);
  DaemonProcess daemon(DaemonConfig{
      .arena_bytes = 16ull << 20, .extra_args = {"--disk-dir", disk}, .fd_store = true});
  std::vector<Prompt> prompts;
  Figures total;
  uint64_t cycles = 0, adopted_total = 0, engine_kills = 0, spills = 0, evictions = 0;
  uint64_t sealed_at_kill = 0;
  bool disk_tier = true;
  const uint64_t deadline = now_msec() + torture_msec();
  while (now_msec() < deadline || cycles < 3) {
    ASSERT_TRUE(daemon.start()) << read_file(daemon.log_path());
    const std::string log = read_file(daemon.log_path());
    disk_tier = disk_tier && log.find("disk tier off") == std::string::npos;
    // Exactly what was sealed on the host at the kill: nothing dropped, nothing invented.
    const uint64_t adopted = cycles == 0 ? 0 : last_adopted(log);
    EXPECT_EQ(adopted, sealed_at_kill) << "cycle " << cycles << "\n" << daemon.log_tail();
    EXPECT_EQ(StatsClient(daemon.socket_path()).get().reservations, 0u);
    adopted_total += adopted;
    const Figures f = verify_all(daemon.socket_path(), distinct(prompts));
    total.add(f);
    EXPECT_EQ(f.wrong_blocks, 0u) << "cycle " << cycles;
    // Publishers and restorers mid-flight; the daemon stopped where it is, counted, killed.
    EngineSwarm swarm(rng_, prompts);
    const uint64_t kill_at = now_msec() + 300 + rng_() % 900;
    StatsClient stats(daemon.socket_path());
    while (now_msec() < kill_at) {
      swarm.step(daemon.socket_path(), 10);
      usleep(1000);
    }
    const kvpark_stats s = stats.get();
    spills += s.spills;
    evictions += s.evictions;
    ::kill(daemon.pid(), SIGSTOP);
    int status = 0;
    ASSERT_EQ(waitpid(daemon.pid(), &status, WUNTRACED), daemon.pid());
    sealed_at_kill = sealed_records(daemon.fd_store().fd("kvpark-state"));
    daemon.kill_hard();
    swarm.kill_all();
    engine_kills += swarm.kills;
    EXPECT_EQ(swarm.wrong_restores, 0u);
    ++cycles;
  }
  ASSERT_TRUE(daemon.start());
  EXPECT_EQ(last_adopted(read_file(daemon.log_path())), sealed_at_kill);
  const Figures f = verify_all(daemon.socket_path(), distinct(prompts));
  total.add(f);
  printf("adoption torture, seed %llu: %llu cycles, %llu entries adopted in all, %llu engine kills, "
         "%llu spills and %llu evictions before the kills; %llu lookups, %llu hits, %llu blocks "
         "verified, %llu wrong\n",
         static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(cycles),
         static_cast<unsigned long long>(adopted_total), static_cast<unsigned long long>(engine_kills),
         static_cast<unsigned long long>(spills), static_cast<unsigned long long>(evictions),
         static_cast<unsigned long long>(total.lookups), static_cast<unsigned long long>(total.hits),
         static_cast<unsigned long long>(total.blocks_verified),
         static_cast<unsigned long long>(total.wrong_blocks));
  EXPECT_GT(adopted_total, 0u) << "a run that adopts nothing proves nothing";
  EXPECT_GT(evictions, 0u) << "the arena never filled: no kill landed near an eviction";
  if (disk_tier) {
    EXPECT_GT(spills, 0u) << "nothing spilled: no kill landed near a spill";
  }
  EXPECT_GT(total.hits, 0u);
  EXPECT_EQ(total.wrong_blocks, 0u);
  EXPECT_EQ(daemon.stop(), 0);
  std::error_code ec;
  fs::remove_all(disk, ec);
}

}  // namespace
}  // namespace kvpark::testing
