// The disk tier seen from the outside: a real kvparkd with --disk-dir on a real
// file system (O_DIRECT does not work on tmpfs), real engine processes, real
// SIGKILLs. Every restore is checked byte for byte by kvpark-test-engine.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <httplib.h>
#include <sys/stat.h>

#include "iouring/record_format.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/integration/in_process.h"
#include "tests/testing/eventually.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint32_t block_tokens = 64;
constexpr uint32_t head_tokens = 1024;  // 16 blocks
constexpr uint32_t blocks_per_head = head_tokens / block_tokens;

// A disk directory on a real file system, removed afterwards.
class DiskDirectory {
 public:
  DiskDirectory() {
    char templ[] = "/var/tmp/kvpark-tier-test-XXXXXX";
    path_ = mkdtemp(templ);
  }
  ~DiskDirectory() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

  // Final record files (interrupted writes end in .tmp; the tier's own state, such as
  // written-today, is not a record).
  std::vector<fs::path> records() const {
    std::vector<fs::path> out;
    for (const auto& e : fs::recursive_directory_iterator(path_)) {
      if (e.is_regular_file() && e.path().extension() == ".kvr") out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Record headers as the files hold them (the test reads them to pick which to remove).
disk::RecordHeader record_header_of(const fs::path& path) {
  disk::RecordHeader h{};
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  return h;
}

class DiskTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{
        .arena_bytes = 16ull << 20,
        .extra_args = {"--disk-dir", disk_.path(), "--spill-on-shutdown=true"}});
    ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
    if (read_file(daemon_->log_path()).find("disk tier off") != std::string::npos) {
      GTEST_SKIP() << "no disk tier here: " << read_file(daemon_->log_path());
    }
  }

  // Replaces the daemon with one started with these extra flags (same disk directory).
  void restart_with(std::vector<std::string> flags, uint64_t arena_bytes = 16ull << 20) {
    daemon_->kill_hard();
    flags.insert(flags.begin(), {"--disk-dir", disk_.path()});
    daemon_ = std::make_unique<DaemonProcess>(
        DaemonConfig{.arena_bytes = arena_bytes, .extra_args = flags});
    ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
  }

  std::vector<std::string> head_args(uint64_t seed, std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--head-seed", std::to_string(seed), "--head-tokens",
                                     std::to_string(head_tokens), "--block-bytes", "65536"};
    args.insert(args.end(), more.begin(), more.end());
    return args;
  }

  EngineRun publish(uint64_t seed, bool shared) {
    std::vector<std::string> more = {"publish"};
    if (shared) more.insert(more.begin(), "--shared");
    return run_engine(*daemon_, head_args(seed, more));
  }

  // Restores a head (waiting for promotions) and checks every byte.
  EngineRun verify(uint64_t seed, uint32_t wait_msec = 10'000) {
    return run_engine(*daemon_, head_args(seed, {"--session", "77", "--wait-msec",
                                                 std::to_string(wait_msec), "verify"}));
  }

  static uint32_t restored(const EngineRun& run) {
    auto r = restores_in(run.output);
    return r.empty() ? 0 : r.back().tokens;
  }

  kvpark_stats wait_for(const std::function<bool(const kvpark_stats&)>& done,
                        int timeout_msec = 20'000) {
    StatsClient stats(daemon_->socket_path());
    kvpark_stats last{};
    EXPECT_TRUE(stats.wait_until(done, timeout_msec, &last))
        << "disk_entries=" << last.disk_entries << " spills=" << last.spills
        << " promotions=" << last.promotions << "\n"
        << read_file(daemon_->log_path());
    return last;
  }

  DiskDirectory disk_;
  std::unique_ptr<DaemonProcess> daemon_;
};

const uint32_t full = full_restore_tokens(head_tokens, block_tokens);

TEST_F(DiskTierTest, SharedHeadWrittenThroughThenEvictedRestoresFromDiskBitExact) {
  ASSERT_EQ(publish(1, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  // Twenty private conversations push the shared head out of the 16 MiB arena.
  for (uint64_t seed = 100; seed < 120; ++seed) ASSERT_EQ(publish(seed, false).exit_code, 0);
  StatsClient stats(daemon_->socket_path());
  EXPECT_GT(stats.get().evictions, 0u);

  const uint64_t found_before = stats.get().lookup_hit_tokens;
  const EngineRun run = verify(1);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), full);
  EXPECT_GT(stats.get().promotions, 0u);
  // What came back from disk counts as found restorable, once.
  EXPECT_EQ(stats.get().lookup_hit_tokens - found_before, full);
}

TEST_F(DiskTierTest, WithoutWaitingTheEngineGetsWhatIsInMemoryAndPromotionsLand) {
  ASSERT_EQ(publish(2, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  ASSERT_TRUE(daemon_->start());
  // Nothing is in the new arena: the first lookup restores nothing but starts promotions.
  const EngineRun first = verify(2, 0);
  EXPECT_EQ(first.exit_code, 0);
  EXPECT_EQ(restored(first), 0u);
  wait_for([](const kvpark_stats& s) { return s.promotions >= blocks_per_head - 1; });
  const EngineRun second = verify(2, 0);
  EXPECT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(restored(second), full);
}

TEST_F(DiskTierTest, DaemonKilledAfterSpillRestoresEverythingThatReachedDisk) {
  ASSERT_EQ(publish(3, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  ASSERT_TRUE(daemon_->start());
  StatsClient stats(daemon_->socket_path());
  EXPECT_EQ(stats.get().disk_entries, blocks_per_head) << "recovery lost records";
  const EngineRun run = verify(3);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), full);
}

TEST_F(DiskTierTest, PlannedShutdownWritesReusedPrivateEntries) {
  ASSERT_EQ(publish(4, false).exit_code, 0);
  ASSERT_EQ(verify(4).exit_code, 0);  // a hit: now worth keeping
  StatsClient before(daemon_->socket_path());
  EXPECT_EQ(before.get().disk_entries, 0u) << "private entries are not written through";
  ASSERT_EQ(daemon_->stop(), 0);
  EXPECT_NE(read_file(daemon_->log_path()).find("to disk before stopping"), std::string::npos);
  ASSERT_TRUE(daemon_->start());
  const EngineRun run = verify(4);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), full);
}

// A hybrid engine (blocks and a snapshot that a restore needs): after a restart the
// small snapshot lands from disk before its blocks. While they come in, the plan must
// still count the snapshot as pending; it used to count it as neither restorable nor
// pending, so an engine stopped waiting and prefilled everything again.
TEST_F(DiskTierTest, SnapshotWhoseBlocksAreStillPromotingStaysPending) {
  constexpr uint64_t ns_low = 0x5a17;
  constexpr uint64_t block_bytes = 64 * 1024;
  constexpr size_t head_blocks = 128;  // 8 MiB of blocks: they land well after the snapshot
  constexpr uint32_t tail_tokens = 10;
  constexpr uint64_t snapshot_bytes = 4096;
  kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
  ns.snapshot_required = 1;
  restart_with({}, 64ull << 20);
  const std::vector<int32_t> prompt = engine_prompt(31, head_blocks * block_tokens + tail_tokens, 3, 50);
  const auto position = static_cast<uint32_t>(head_blocks * block_tokens + tail_tokens);
  {
    ClientPtr c = connect_client(daemon_->socket_path(), ns);
    ASSERT_TRUE(c);
    const std::vector<kvpark_hash128> hashes = block_hashes(ns_low, prompt, block_tokens);
    const kvpark_publish_options options{7, KVPARK_CLASS_SHARED, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
    kvpark_reservation* blocks = nullptr;
    ASSERT_EQ(kvpark_reserve_blocks(c.get(), &options, prompt.data(), prompt.size(), 0, head_blocks, &blocks),
              KVPARK_OK);
    for (size_t i = 0; i < head_blocks; ++i) {
      fill_payload(payload_key(hashes[i]), kvpark_reservation_block(blocks, i), block_bytes);
    }
    ASSERT_EQ(kvpark_seal(blocks), KVPARK_OK);
    kvpark_reservation* snapshot = nullptr;
    ASSERT_EQ(kvpark_reserve_snapshot(c.get(), &options, prompt.data(), position, snapshot_bytes, &snapshot),
              KVPARK_OK);
    fill_payload(position, kvpark_reservation_snapshot(snapshot), snapshot_bytes);
    ASSERT_EQ(kvpark_seal(snapshot), KVPARK_OK);
  }
  wait_for([&](const kvpark_stats& s) { return s.disk_entries == head_blocks + 1; });
  restart_with({}, 64ull << 20);

  ClientPtr c = connect_client(daemon_->socket_path(), ns);
  ASSERT_TRUE(c);
  kvpark_plan* raw = nullptr;
  ASSERT_EQ(kvpark_lookup(c.get(), 8, prompt.data(), prompt.size(), &raw), KVPARK_OK);
  PlanPtr plan(raw);
  EXPECT_EQ(kvpark_plan_pending_tokens(plan.get()), position) << "the lookup starts every promotion";
  // Short waits see the promotions land piece by piece; at every step the plan
  // promises either the whole snapshot or that it is still coming.
  size_t waits = 0;
  const uint64_t deadline = now_msec() + 20'000;
  while (kvpark_plan_pending_tokens(plan.get()) > kvpark_plan_restorable_tokens(plan.get()) &&
         now_msec() < deadline) {
    const kvpark_status s = kvpark_plan_wait(plan.get(), 1);
    ASSERT_TRUE(s == KVPARK_OK || s == KVPARK_TIMEOUT) << kvpark_status_string(s);
    ++waits;
    const uint32_t restorable = kvpark_plan_restorable_tokens(plan.get());
    ASSERT_TRUE(restorable == 0 || restorable == position) << restorable;
    if (restorable < position) {
      ASSERT_EQ(kvpark_plan_pending_tokens(plan.get()), position) << "after " << waits << " waits";
    }
  }
  printf("promotions landed over %zu waits of 1 ms\n", waits);
  ASSERT_EQ(kvpark_plan_restorable_tokens(plan.get()), position);
  std::vector<uint8_t> restored_snapshot(snapshot_bytes);
  ASSERT_EQ(kvpark_plan_copy_snapshot(plan.get(), restored_snapshot.data(), snapshot_bytes), KVPARK_OK);
  EXPECT_TRUE(payload_matches(position, restored_snapshot.data(), snapshot_bytes));
  EXPECT_EQ(kvpark_plan_block_count(plan.get()), head_blocks);
  EXPECT_TRUE(plan_blocks_match(plan.get(), ns_low, block_bytes, prompt, block_tokens));
}

TEST_F(DiskTierTest, FlippedBitInARecordIsAMissAndACounterNeverServed) {
  ASSERT_EQ(publish(5, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  const auto records = disk_.records();
  ASSERT_EQ(records.size(), blocks_per_head);
  for (const fs::path& record : records) {  // one bit in every record's payload
    std::fstream f(record, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-100, std::ios::end);
    f.write(&c, 1);
  }
  ASSERT_TRUE(daemon_->start());
  const EngineRun run = verify(5);
  EXPECT_EQ(run.exit_code, 0) << "corrupt bytes were served: " << run.output;
  EXPECT_EQ(restored(run), 0u);
  StatsClient stats(daemon_->socket_path());
  const kvpark_stats s = stats.get();
  EXPECT_GE(s.checksum_failures, 1u);
  EXPECT_EQ(s.promotions, 0u);
  // The lookup leased every block to promote it; none could be restored, and none
  // counts as found restorable.
  EXPECT_EQ(s.lookup_hit_tokens, 0u);
}

TEST_F(DiskTierTest, TruncatedAndZeroedRecordsAreDroppedAtRecovery) {
  ASSERT_EQ(publish(6, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  const auto records = disk_.records();
  ASSERT_EQ(records.size(), blocks_per_head);
  // Recovery keeps the chain up to the first damaged block: what follows is unreachable.
  const uint32_t reachable = std::min(record_header_of(records[0]).anchor_chunks,
                                      record_header_of(records[1]).anchor_chunks);
  fs::resize_file(records[0], fs::file_size(records[0]) / 2);
  {
    std::fstream f(records[1], std::ios::in | std::ios::out | std::ios::binary);
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), zeros.size());
  }
  ASSERT_TRUE(daemon_->start());
  StatsClient stats(daemon_->socket_path());
  EXPECT_EQ(stats.get().disk_entries, reachable);
  const EngineRun run = verify(6);
  EXPECT_EQ(run.exit_code, 0) << "damaged bytes were served: " << run.output;
  EXPECT_EQ(restored(run), reachable * block_tokens);
}

TEST_F(DiskTierTest, SigkillDuringSpillsNeverServesBadBytesAndKeepsCompletedSpills) {
  constexpr int rounds = 20;
  std::mt19937 random(20261129);
  std::vector<uint64_t> completed;  // heads whose every block had reached disk
  uint64_t interrupted = 0;         // the head being spilled when the daemon died
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    if (round > 0) {
      ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
    }
    for (uint64_t seed : completed) {
      const EngineRun run = verify(seed);
      ASSERT_EQ(run.exit_code, 0) << "seed " << seed << ": " << run.output;
      ASSERT_EQ(restored(run), full) << "seed " << seed << " lost a completed spill";
    }
    if (interrupted != 0) {
      // Whatever survived of it verifies; then park it whole.
      const EngineRun run = verify(interrupted);
      ASSERT_EQ(run.exit_code, 0) << "seed " << interrupted << ": " << run.output;
      ASSERT_EQ(publish(interrupted, true).exit_code, 0);
      completed.push_back(interrupted);
      const uint64_t expected = completed.size() * blocks_per_head;
      wait_for([&](const kvpark_stats& s) { return s.disk_entries == expected; });
    }
    interrupted = 1000 + round;
    ChildProcess publisher = spawn_engine(*daemon_, head_args(interrupted, {"--shared", "publish"}));
    // The fault lands at a random point of the publish (not a wait for anything):
    // early kills interrupt nothing, later ones a spill; both must leave no bad bytes.
    usleep(std::uniform_int_distribution<int>(0, 40'000)(random));
    daemon_->kill_hard();
    publisher.wait_exit(10'000);
  }
  EXPECT_EQ(completed.size(), static_cast<size_t>(rounds - 1));
}

TEST_F(DiskTierTest, EngineWaitingOnAPromotionGetsAnErrorWhenTheDaemonDies) {
  // One large snapshot, so its promotion is still reading when the daemon dies.
  daemon_->kill_hard();
  daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{
      .arena_bytes = 640ull << 20, .extra_args = {"--disk-dir", disk_.path()}});
  ASSERT_TRUE(daemon_->start());
  // A snapshot-only engine parks its state after 300 tokens; the restorer's prompt
  // has one token more, so that state is restorable for it.
  const std::vector<std::string> snapshot = {"--block-tokens", "0", "--head-tokens", "300",
                                             "--snapshot-bytes", std::to_string(256ull << 20)};
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = snapshot;
    args.insert(args.end(), more.begin(), more.end());
    return args;
  };
  ASSERT_EQ(run_engine(*daemon_, with({"--shared", "publish"}), 60'000).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == 1; }, 60'000);
  int errors = 0;
  for (int attempt = 0; attempt < 3 && errors == 0; ++attempt) {
    daemon_->kill_hard();
    ASSERT_TRUE(daemon_->start());
    ChildProcess engine =
        spawn_engine(*daemon_, with({"--body-tokens", "1", "--wait-msec", "60000", "verify"}));
    ASSERT_TRUE(engine.wait_for_line("waiting", 20'000));
    daemon_->kill_hard();
    const int code = engine.wait_exit(10'000);
    ASSERT_NE(code, -1) << "the engine hung on a dead daemon";
    if (code == 4) ++errors;  // a libkvpark call failed: the wait reported the lost daemon
    else ASSERT_EQ(code, 0) << "restored bytes differ";
  }
  EXPECT_GT(errors, 0) << "every promotion finished before the kill; nothing was shown";
}

// How long a test watches for a spill that must never come.
constexpr int budget_watch_msec = 300;

// One 64-token block of 64 KiB: a 68 KiB extent, a 76 KiB record file.
constexpr uint64_t block_extent_bytes = 4096 + 65536;
constexpr uint64_t block_record_bytes = 4096 + 4096 + block_extent_bytes;

TEST_F(DiskTierTest, DailyWriteBudgetStopsBackgroundSpillsButNotAFlush) {
  restart_with({"--disk-write-budget-per-day", std::to_string(4 * block_extent_bytes + 100)});
  ASSERT_EQ(publish(7, true).exit_code, 0);  // shared: written through, within budget
  wait_for([](const kvpark_stats& s) { return s.disk_entries == 4; });
  // Every write-through was decided at seal, before the engine exited: nothing may
  // land after. An absence has no event to wait for; it is watched for a while and
  // a slow machine only makes the watch weaker, never the test fail.
  StatsClient stats(daemon_->socket_path());
  EXPECT_FALSE(wait_until([&] { return stats.get().disk_entries > 4; }, budget_watch_msec))
      << "the budget was overrun";
  EXPECT_EQ(stats.get().disk_entries, 4u);
  // A planned shutdown is the operator's request: it writes the rest regardless.
  ASSERT_EQ(daemon_->stop(), 0);
  EXPECT_EQ(disk_.records().size(), blocks_per_head);
}

// Two heads of 16 blocks into room for 10 records: the first head's chain is taken
// from its tip, then the second's. Every record kept leads from its predecessor's,
// so a restart keeps them all. (Plain LRU took each chain's root first: the records
// it kept were unreachable, and a spill landing behind an evicted record was lost.)
TEST_F(DiskTierTest, DiskCapacityEvictsChainsFromTheirTipAndKeepsWhatItHoldsReachable) {
  constexpr uint64_t capacity_records = 10;
  restart_with({"--disk-capacity", std::to_string(capacity_records * block_record_bytes)});
  ASSERT_EQ(publish(8, true).exit_code, 0);
  ASSERT_EQ(publish(9, true).exit_code, 0);
  StatsClient stats(daemon_->socket_path());
  kvpark_stats s{};
  ASSERT_TRUE(stats.wait_until([](const kvpark_stats& st) { return st.spills == 2 * blocks_per_head; },
                               20'000, &s)) << "spills=" << s.spills;
  EXPECT_LE(s.disk_bytes, capacity_records * block_record_bytes);
  EXPECT_EQ(s.disk_entries, capacity_records);
  // Removals are asynchronous unlinks: wait for them, then nothing more goes.
  EXPECT_TRUE(eventually("the evicted records are unlinked",
                         [&] { return disk_.records().size() <= capacity_records; }))
      << disk_.records().size() << " records";
  EXPECT_EQ(disk_.records().size(), capacity_records);
  for (uint64_t seed : {8, 9}) EXPECT_EQ(verify(seed).exit_code, 0);
  daemon_->kill_hard();
  ASSERT_TRUE(daemon_->start());
  EXPECT_EQ(StatsClient(daemon_->socket_path()).get().disk_entries, capacity_records)
      << read_file(daemon_->log_path());
  const std::string log = read_file(daemon_->log_path());  // every start's, appended
  const std::string last_recovery = log.substr(std::min(log.rfind("disk tier at"), log.size()));
  EXPECT_NE(last_recovery.find("10 records recovered"), std::string::npos) << last_recovery;
  EXPECT_NE(last_recovery.find("of which 0 unreachable and removed"), std::string::npos)
      << last_recovery;
}

TEST(DiskTierStart, AnUnusableDirectoryIsOneLogLineAndTheHostTierServes) {
  DaemonProcess daemon(DaemonConfig{.extra_args = {"--disk-dir", "/proc/version/kvpark"}});
  ASSERT_TRUE(daemon.start());
  const std::string log = read_file(daemon.log_path());
  EXPECT_NE(log.find("disk tier off"), std::string::npos) << log;
  const EngineRun publish = run_engine(daemon, {"publish"});
  ASSERT_EQ(publish.exit_code, 0);
  const EngineRun verify = run_engine(daemon, {"--session", "5", "verify"});
  EXPECT_EQ(verify.exit_code, 0);
  EXPECT_EQ(restores_in(verify.output).back().tokens, full_restore_tokens(1024, 64));
}


TEST_F(DiskTierTest, RegressionPrefixParkedPrivateThenPresentedSharedIsWrittenThrough) {
  ASSERT_EQ(publish(20, false).exit_code, 0);
  StatsClient stats(daemon_->socket_path());
  EXPECT_EQ(stats.get().disk_entries, 0u) << "private entries are not written through";
  // The same head again, as shared: every block is Present, and must not keep its class.
  const EngineRun again = publish(20, true);
  ASSERT_EQ(again.exit_code, 0);
  EXPECT_EQ(published_in(again.output), 0) << "nothing to write: all present";
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  ASSERT_TRUE(daemon_->start());
  const EngineRun run = verify(20);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), full);
}

TEST_F(DiskTierTest, RecordsBehindAMissingBlockAreRemovedAtRecovery) {
  ASSERT_EQ(publish(21, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  // A crash took block 8's record (as if it had not reached disk while later ones did).
  constexpr uint32_t missing = 8;
  size_t removed = 0;
  for (const fs::path& p : disk_.records()) {
    if (record_header_of(p).anchor_chunks == missing) removed += fs::remove(p) ? 1 : 0;
  }
  ASSERT_EQ(removed, 1u);
  ASSERT_TRUE(daemon_->start());
  StatsClient stats(daemon_->socket_path());
  // Blocks 0..7 are reachable; 9..15 are not, and their records go.
  EXPECT_EQ(stats.get().disk_entries, missing);
  (void)wait_until([&] { return disk_.records().size() == missing; });
  EXPECT_EQ(disk_.records().size(), missing) << "every record left is reachable";
  EXPECT_NE(read_file(daemon_->log_path()).find("of which 7 unreachable and removed"),
            std::string::npos)
      << read_file(daemon_->log_path());
  const EngineRun run = verify(21);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), missing * block_tokens);
}

// Makes a directory read-only: a read-only bind mount when we may mount (root), else
// its mode bits (which root would ignore). Undone by the destructor.
class ReadOnly {
 public:
  explicit ReadOnly(const std::string& dir) : dir_(dir) {
    if (geteuid() == 0) {
      mounted_ = run_process({"/bin/mount", "--bind", dir, dir}, 5000, nullptr) == 0 &&
                 run_process({"/bin/mount", "-o", "remount,bind,ro", dir}, 5000, nullptr) == 0;
      ok_ = mounted_;
      return;
    }
    ok_ = true;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      if (e.is_directory()) ok_ = ok_ && chmod(e.path().c_str(), 0555) == 0;
    }
    ok_ = ok_ && chmod(dir.c_str(), 0555) == 0;
  }
  ~ReadOnly() {
    if (mounted_) {
      run_process({"/bin/umount", "-l", dir_}, 5000, nullptr);
      return;
    }
    chmod(dir_.c_str(), 0755);
    for (const auto& e : fs::recursive_directory_iterator(dir_)) {
      if (e.is_directory()) chmod(e.path().c_str(), 0755);
    }
  }
  bool ok() const { return ok_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  bool ok_ = false;
};

TEST_F(DiskTierTest, ReadOnlyDirectoryIsServedReadOnly) {
  ASSERT_EQ(publish(22, true).exit_code, 0);
  wait_for([](const kvpark_stats& s) { return s.disk_entries == blocks_per_head; });
  daemon_->kill_hard();
  const size_t records = disk_.records().size();
  ReadOnly read_only(disk_.path());
  if (!read_only.ok()) GTEST_SKIP() << "cannot make " << disk_.path() << " read-only here";
  restart_with({"--http-listen", "127.0.0.1:0"});
  const std::string log = read_file(daemon_->log_path());
  EXPECT_EQ(log.find("disk tier off"), std::string::npos) << log;
  size_t lines = 0;
  for (size_t at = log.find("is read-only"); at != std::string::npos; at = log.find("is read-only", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << log;
  // Restores work.
  const EngineRun run = verify(22);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(restored(run), full);
  // Spills stop: a new shared head stays in memory.
  ASSERT_EQ(publish(23, true).exit_code, 0);
  StatsClient stats(daemon_->socket_path());
  const kvpark_stats s = stats.get();
  EXPECT_EQ(s.disk_entries, blocks_per_head);
  EXPECT_EQ(s.spills, 0u);
  EXPECT_EQ(disk_.records().size(), records);
  // Status shows it (on the port its READY=1 status names).
  ASSERT_GT(daemon_->http_port(), 0) << log;
  httplib::Client client("127.0.0.1", static_cast<uint16_t>(daemon_->http_port()));
  const auto status = client.Get("/v1/status");
  ASSERT_TRUE(status);
  EXPECT_NE(status->body.find("\"disk_read_only\":true"), std::string::npos) << status->body;
  // And /health calls it degraded, naming why.
  const auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503) << health->body;
  EXPECT_NE(health->body.find("\"status\":\"degraded\""), std::string::npos) << health->body;
  EXPECT_NE(health->body.find("is read-only"), std::string::npos) << health->body;
  daemon_->kill_hard();
}

}  // namespace
}  // namespace kvpark::testing
