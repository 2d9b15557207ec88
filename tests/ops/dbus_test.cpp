// kvparkctl driving a real kvparkd over a private D-Bus bus (tests/ops/dbus_bus.h).
//
// Each test starts its own dbus-daemon and kvparkd (session-bus mode, pointed at
// the private bus through DBUS_SESSION_BUS_ADDRESS), publishes entries with
// kvpark-test-engine, and checks kvparkctl's output and exit codes: 0 ok,
// 1 failure, 2 usage, 3 not found, 4 permission denied, 5 unavailable.
#include <gtest/gtest.h>

#include <pwd.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

#include <atomic>
#include <cstdlib>
#include <regex>
#include <sdbus-c++/sdbus-c++.h>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "proto/dbus_api.h"
#include "proto/version.h"
#include "tests/integration/in_process.h"
#include "tests/ops/dbus_bus.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/eventually.h"

using namespace kvpark::testing;

namespace {

constexpr int command_timeout_msec = 20'000;
constexpr uid_t nobody_uid = 65534;
constexpr gid_t nobody_gid = 65534;
constexpr uint64_t block_bytes = 64 * 1024;  // kvpark-test-engine's default block image

struct Result {
  int code = -1;
  std::string out;
};

Result ctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {built_binary("KVPARKCTL"), "--user"};
  argv.insert(argv.end(), args.begin(), args.end());
  Result r;
  r.code = run_process(argv, command_timeout_msec, &r.out);
  return r;
}

Result ctl_as_nobody(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {built_binary("KVPARKCTL"), "--user"};
  argv.insert(argv.end(), args.begin(), args.end());
  Result r;
  r.code = run_as(nobody_uid, nobody_gid, argv, command_timeout_msec, &r.out);
  return r;
}

// The unsigned number after "key": in a JSON document; -1 when absent.
int64_t json_number(const std::string& json, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(json, m, std::regex("\"" + key + "\":([0-9]+)"))) return -1;
  return std::stoll(m[1]);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint64_t> json_ids(const std::string& json) {
  std::vector<uint64_t> ids;
  const std::regex id("\"id\":\"([0-9]+)\"");  // entry ids are strings (json_schema.h)
  for (auto it = std::sregex_iterator(json.begin(), json.end(), id); it != std::sregex_iterator();
       ++it) {
    ids.push_back(std::stoull((*it)[1]));
  }
  return ids;
}

class DbusControl : public ::testing::Test {
 protected:
  void SetUp() override { start_bus_and_daemon(""); }

  void start_bus_and_daemon(const std::string& policy_file) {
    if (!PrivateBus::available()) GTEST_SKIP() << "dbus-daemon is not installed";
    bus_ = std::make_unique<PrivateBus>(policy_file);
    ASSERT_TRUE(bus_->running()) << "the private dbus-daemon did not start";
    setenv("DBUS_SESSION_BUS_ADDRESS", bus_->address().c_str(), 1);
    daemon_ = std::make_unique<DaemonProcess>(
        DaemonConfig{.arena_bytes = 64ull << 20, .extra_args = {"--dbus", "session"}});
    // READY=1 comes after the bus name is claimed: kvparkctl reaches it at once.
    ASSERT_TRUE(daemon_->start());
    ASSERT_EQ(ctl({"status"}).code, 0) << "kvparkd is ready but not on the private bus";
  }

  void TearDown() override {
    daemon_.reset();
    bus_.reset();
  }

  // Publishes `blocks` private blocks of 64 tokens in namespace `ns`.
  void publish(uint64_t ns, size_t blocks, bool shared = false) {
    std::vector<std::string> argv = {built_binary("KVPARK_TEST_ENGINE"), "--socket",
                                     daemon_->socket_path(), "--ns", std::to_string(ns),
                                     "--head-tokens", std::to_string(blocks * 64),
                                     "--head-seed", std::to_string(ns * 100 + blocks)};
    if (shared) argv.push_back("--shared");
    argv.push_back("publish");
    ASSERT_EQ(run_process(argv, command_timeout_msec, nullptr), 0);
  }

  std::vector<uint64_t> entry_ids() {
    Result r = ctl({"--json", "list", "--limit", "1000"});
    EXPECT_EQ(r.code, 0);
    return json_ids(r.out);
  }

  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(DbusControl, StatusShowsArenaAndPopulation) {
  publish(7, 4);
  Result human = ctl({"status"});
  ASSERT_EQ(human.code, 0);
  EXPECT_NE(human.out.find(std::string("kvparkd ") + kvpark::version), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("Entries: 4 (4 blocks, 0 snapshots, 0 pinned) in 1 namespaces"),
            std::string::npos) << human.out;
  EXPECT_NE(human.out.find(daemon_->socket_path()), std::string::npos) << human.out;
  Result json = ctl({"--json", "status"});
  ASSERT_EQ(json.code, 0);
  EXPECT_EQ(json_number(json.out, "entries"), 4) << json.out;
  EXPECT_EQ(json_number(json.out, "arena_data_bytes"), 64 << 20) << json.out;
}

// kvparkctl status says "tokens restored" for what a client restored (M of the N a
// lookup found restorable), next to "restorable"; --json has both.
TEST_F(DbusControl, StatusShowsTokensRestoredNextToRestorable) {
  constexpr uint64_t ns_low = 77;
  constexpr uint32_t block_tokens = 64;
  constexpr size_t blocks = 4;
  const kvpark_namespace ns = engine_namespace(ns_low, block_tokens, block_bytes);
  ClientPtr client = connect_client(daemon_->socket_path(), ns);
  ASSERT_TRUE(client);
  const auto tokens = engine_prompt(5, blocks * block_tokens + 3);
  ASSERT_EQ(park_blocks(client.get(), ns_low, block_bytes, tokens, 1), KVPARK_OK);
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client.get(), 1, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  ASSERT_EQ(kvpark_plan_restorable_tokens(plan), blocks * block_tokens);
  std::vector<uint8_t> block(block_bytes);
  ASSERT_EQ(kvpark_plan_copy_block(plan, 0, block.data()), KVPARK_OK);
  kvpark_plan_set_restored_tokens(plan, block_tokens);
  kvpark_plan_release(plan);
  Result json;
  ASSERT_TRUE(eventually("the one-way release is counted", [&] {
    json = ctl({"--json", "status"});
    return json_number(json.out, "leases") == 0;
  }));
  EXPECT_EQ(json_number(json.out, "restored_tokens"), block_tokens) << json.out;
  EXPECT_EQ(json_number(json.out, "lookup_hit_tokens"), int64_t(blocks * block_tokens)) << json.out;
  Result human = ctl({"status"});
  ASSERT_EQ(human.code, 0);
  EXPECT_NE(human.out.find("Lookups: 1, 256 tokens restorable"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("; 64 tokens restored"), std::string::npos) << human.out;
}

TEST_F(DbusControl, ListShowsEntriesAndFilters) {
  publish(7, 4);
  publish(8, 2, /*shared=*/true);
  Result human = ctl({"list"});
  ASSERT_EQ(human.code, 0);
  EXPECT_NE(human.out.find("6 of 6 entries listed."), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("ID"), std::string::npos);
  // Not a TTY: full width, nothing cut (ctl_test checks widths on a terminal).
  EXPECT_EQ(human.out.find("…"), std::string::npos) << human.out;

  Result all = ctl({"--json", "list"});
  ASSERT_EQ(all.code, 0);
  EXPECT_EQ(json_number(all.out, "total"), 6);
  EXPECT_EQ(json_ids(all.out).size(), 6u);

  Result ns7 = ctl({"--json", "list", "--namespace", "7"});
  EXPECT_EQ(json_number(ns7.out, "total"), 4) << ns7.out;
  Result shared = ctl({"--json", "list", "--class", "shared"});
  EXPECT_EQ(json_number(shared.out, "total"), 2) << shared.out;
  Result disk = ctl({"--json", "list", "--tier", "disk"});
  EXPECT_EQ(json_number(disk.out, "total"), 0) << disk.out;
  Result page = ctl({"--json", "list", "--limit", "2", "--offset", "1"});
  EXPECT_EQ(json_number(page.out, "total"), 6);
  EXPECT_EQ(json_ids(page.out).size(), 2u);

  EXPECT_EQ(ctl({"list", "--tier", "tape"}).code, 2);
  EXPECT_EQ(ctl({"list", "--limit", "0"}).code, 2);
}

TEST_F(DbusControl, ShowReportsOneEntryAndNotFound) {
  publish(7, 1);
  const std::vector<uint64_t> ids = entry_ids();
  ASSERT_EQ(ids.size(), 1u);
  Result human = ctl({"show", std::to_string(ids[0])});
  ASSERT_EQ(human.code, 0);
  EXPECT_NE(human.out.find("Kind: block"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("Namespace: 00000000000000000000000000000007"), std::string::npos)
      << human.out;
  Result json = ctl({"--json", "show", std::to_string(ids[0])});
  EXPECT_EQ(json_number(json.out, "position"), 64) << json.out;
  EXPECT_EQ(ctl({"show", "999999"}).code, 3);
  EXPECT_EQ(ctl({"show", "abc"}).code, 2);
}

TEST_F(DbusControl, PinnedEntryRefusesEvictionUntilUnpinned) {
  publish(7, 3);
  const std::vector<uint64_t> ids = entry_ids();
  ASSERT_EQ(ids.size(), 3u);
  const std::string id = std::to_string(ids[1]);
  ASSERT_EQ(ctl({"pin", id}).code, 0);
  EXPECT_NE(ctl({"show", id}).out.find("Pinned: yes"), std::string::npos);
  EXPECT_EQ(ctl({"evict", id}).code, 1) << "a pinned entry must not be evicted";
  EXPECT_EQ(ctl({"show", id}).code, 0) << "the pinned entry is still there";
  ASSERT_EQ(ctl({"unpin", id}).code, 0);
  EXPECT_EQ(ctl({"evict", id}).code, 0);
  EXPECT_EQ(ctl({"show", id}).code, 3) << "the evicted entry is gone";
  EXPECT_EQ(entry_ids().size(), 2u);
  EXPECT_EQ(ctl({"evict", id}).code, 3);
  EXPECT_EQ(ctl({"pin", "999999"}).code, 3);
}

TEST_F(DbusControl, SetLimitArenaLowWaterEvictsDownToTheMark) {
  publish(7, 40);
  ASSERT_EQ(entry_ids().size(), 40u);
  ASSERT_EQ(ctl({"set-limit", "arena-low-water", "63M"}).code, 0);
  Result stats = ctl({"--json", "stats"});
  ASSERT_EQ(stats.code, 0);
  EXPECT_GE(json_number(stats.out, "arena_free_bytes"), 63 << 20) << stats.out;
  EXPECT_EQ(json_number(stats.out, "arena_low_water_bytes"), 63 << 20);
  const int64_t entries = json_number(stats.out, "entries");
  EXPECT_LT(entries, 40);
  EXPECT_GT(entries, 0) << "eviction stops at the mark, it does not empty the arena";
  EXPECT_EQ(json_number(stats.out, "evictions"), 40 - entries);

  EXPECT_EQ(ctl({"set-limit", "arena-low-water", "lots"}).code, 2);
  EXPECT_EQ(ctl({"set-limit", "no-such-limit", "1G"}).code, 2);
  EXPECT_EQ(ctl({"set-limit", "arena-low-water", "1T"}).code, 2) << "more than the arena";
}

// set-limit says in the log who changed what from what to what, and keeps it in the
// state directory's runtime-overrides.conf: a restarted daemon runs with it, and
// removing the file and reloading goes back to the configured value.
TEST_F(DbusControl, SetLimitIsLoggedAndKeptAcrossARestart) {
  char templ[] = "/tmp/kvpark-state-test-XXXXXX";
  const std::string state = mkdtemp(templ);
  const std::string overrides = state + "/runtime-overrides.conf";
  daemon_.reset();
  daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{
      .arena_bytes = 64ull << 20, .extra_args = {"--dbus", "session", "--state-dir", state}});
  ASSERT_TRUE(daemon_->start());
  ASSERT_EQ(ctl({"status"}).code, 0) << "kvparkd is ready but not on the private bus";
  ASSERT_EQ(ctl({"set-limit", "arena-low-water", "8M"}).code, 0);
  ASSERT_EQ(ctl({"set-limit", "arena-low-water", "12M"}).code, 0);
  const passwd* me = getpwuid(geteuid());
  ASSERT_NE(me, nullptr);
  const std::string log = read_text(daemon_->log_path());
  const std::string who = std::string(me->pw_name) + " (uid " + std::to_string(geteuid()) + ", pid ";
  EXPECT_NE(log.find("kvparkd: limit arena-low-water changed from 0 to 8M by " + who),
            std::string::npos) << log;
  EXPECT_NE(log.find("kvparkd: limit arena-low-water changed from 8M to 12M by " + who),
            std::string::npos) << log;
  EXPECT_NE(log.find(") over D-Bus; kept in " + overrides + "\n"), std::string::npos) << log;
  const std::string kept = read_text(overrides);
  EXPECT_NE(kept.find("\narena_low_water = 12M\n"), std::string::npos) << kept;
  EXPECT_FALSE(std::filesystem::exists(overrides + ".tmp"));

  ASSERT_TRUE(daemon_->restart());
  ASSERT_EQ(ctl({"status"}).code, 0);
  EXPECT_EQ(json_number(ctl({"--json", "stats"}).out, "arena_low_water_bytes"), 12 << 20);
  EXPECT_NE(read_text(daemon_->log_path()).find("runtime overrides from " + overrides +
                                                ": arena_low_water = 12M"),
            std::string::npos) << read_text(daemon_->log_path());

  // Cleared: remove the file, reload.
  std::filesystem::remove(overrides);
  Result reload = ctl({"reload"});
  EXPECT_EQ(reload.code, 0) << reload.out;
  EXPECT_EQ(json_number(ctl({"--json", "stats"}).out, "arena_low_water_bytes"), 0);
  std::filesystem::remove_all(state);
}

TEST_F(DbusControl, FlushWithoutDiskTierFailsClearly) {
  Result r = ctl({"flush"});
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out, "") << "no progress is shown for a flush that never started";
}

TEST_F(DbusControl, FlushWritesEveryHostEntryToDiskAndShowsProgress) {
  char templ[] = "/var/tmp/kvpark-flush-test-XXXXXX";
  const std::string disk = mkdtemp(templ);
  daemon_.reset();
  daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{
      .arena_bytes = 64ull << 20, .extra_args = {"--dbus", "session", "--disk-dir", disk}});
  ASSERT_TRUE(daemon_->start());
  ASSERT_EQ(ctl({"status"}).code, 0) << "kvparkd is ready but not on the private bus";
  publish(7, 20);  // private one-offs: not written through
  EXPECT_EQ(json_number(ctl({"--json", "status"}).out, "spills"), 0);

  Result r = ctl({"flush"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("100%"), std::string::npos) << "no final progress line: " << r.out;
  EXPECT_EQ(json_number(ctl({"--json", "status"}).out, "spills"), 20);
  size_t records = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(disk)) {
    records += e.is_regular_file() && e.path().extension() == ".kvr";
  }
  EXPECT_EQ(records, 20u);
  Result json = ctl({"--json", "flush"});  // nothing left: done at once
  EXPECT_EQ(json.code, 0);
  EXPECT_EQ(json_number(json.out, "entries_total"), 0) << json.out;
  std::filesystem::remove_all(disk);
}

TEST_F(DbusControl, StatsJsonAgreesWithLibkvparkStats) {
  publish(7, 5);
  publish(9, 3, /*shared=*/true);
  kvpark_namespace ns{};
  ns.id = {7, 0};
  ns.block_tokens = 64;
  ns.block_payload_bytes = block_bytes;
  ns.client_name = "dbus-test";
  kvpark_client* client = nullptr;
  ASSERT_EQ(kvpark_connect(daemon_->socket_path().c_str(), &ns, &client), KVPARK_OK);
  kvpark_stats own{};
  ASSERT_EQ(kvpark_get_stats(client, &own), KVPARK_OK);
  Result stats = ctl({"--json", "stats"});
  kvpark_disconnect(client);
  ASSERT_EQ(stats.code, 0);
  EXPECT_EQ(json_number(stats.out, "arena_data_bytes"), int64_t(own.arena_data_bytes));
  EXPECT_EQ(json_number(stats.out, "arena_free_bytes"), int64_t(own.arena_free_bytes));
  EXPECT_EQ(json_number(stats.out, "arena_largest_free_bytes"),
            int64_t(own.arena_largest_free_bytes));
  EXPECT_EQ(json_number(stats.out, "blocks"), int64_t(own.blocks));
  EXPECT_EQ(json_number(stats.out, "snapshots"), int64_t(own.snapshots));
  EXPECT_EQ(json_number(stats.out, "namespaces"), int64_t(own.namespaces));
  EXPECT_EQ(json_number(stats.out, "connections"), int64_t(own.connections));
  EXPECT_EQ(json_number(stats.out, "leases"), int64_t(own.leases));
  EXPECT_EQ(json_number(stats.out, "lookups"), int64_t(own.lookups));
  EXPECT_EQ(json_number(stats.out, "evictions"), int64_t(own.evictions));
  EXPECT_EQ(json_number(stats.out, "dedup_hits"), int64_t(own.dedup_hits));
  EXPECT_EQ(own.blocks, 8u);
}

TEST_F(DbusControl, UnprivilegedCallerIsRefusedMutatingMethods) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run kvparkctl as nobody";
  publish(7, 2);
  const std::vector<uint64_t> ids = entry_ids();
  ASSERT_EQ(ids.size(), 2u);
  const std::string pinned = std::to_string(ids[0]), plain = std::to_string(ids[1]);
  ASSERT_EQ(ctl({"pin", pinned}).code, 0);

  Result status = ctl_as_nobody({"status"});
  EXPECT_EQ(status.code, 0) << "reading is open to everyone";
  EXPECT_EQ(ctl_as_nobody({"unpin", pinned}).code, 4);
  EXPECT_EQ(ctl_as_nobody({"evict", plain}).code, 4);
  EXPECT_EQ(ctl_as_nobody({"set-limit", "arena-low-water", "63M"}).code, 4);
  EXPECT_EQ(ctl_as_nobody({"drop-namespace", "7"}).code, 4);
  EXPECT_EQ(ctl_as_nobody({"flush"}).code, 4);

  EXPECT_NE(ctl({"show", pinned}).out.find("Pinned: yes"), std::string::npos);
  EXPECT_EQ(ctl({"show", plain}).code, 0) << "the refused evict left the entry in place";
  Result stats = ctl({"--json", "stats"});
  EXPECT_EQ(json_number(stats.out, "arena_low_water_bytes"), 0);
}

TEST_F(DbusControl, PropertiesShowLiveFigures) {
  publish(7, 3);
  auto bus = sdbus::createSessionBusConnection();
  auto proxy = sdbus::createProxy(*bus, kvpark::dbus_api::bus_name, kvpark::dbus_api::object_path);
  auto get = [&](const char* name) {
    return proxy->getProperty(name).onInterface(kvpark::dbus_api::interface_name).get<uint64_t>();
  };
  EXPECT_EQ(get("Entries"), 3u);
  EXPECT_EQ(get("Namespaces"), 1u);
  EXPECT_EQ(get("ArenaBytes"), 64u << 20);
  const uint64_t free_before = get("ArenaFreeBytes");
  publish(7, 5);  // a new head seed: five more blocks
  EXPECT_EQ(get("Entries"), 8u);
  EXPECT_LT(get("ArenaFreeBytes"), free_before);
}

// The adapter's own records, not kvparkctl's mapping of them: the names and the id
// grammar are the HTTP API's (proto/names.h).
TEST_F(DbusControl, EntriesUseTheHttpNamesAndReadIdsInOneGrammar) {
  publish(7, 2);
  publish(8, 1, /*shared=*/true);
  auto bus = sdbus::createSessionBusConnection();
  auto proxy = sdbus::createProxy(*bus, kvpark::dbus_api::bus_name, kvpark::dbus_api::object_path);
  using Dict = std::map<std::string, sdbus::Variant>;
  auto list = [&](const std::string& namespace_text) {
    std::vector<Dict> entries;
    uint64_t total = 0;
    proxy->callMethod("ListEntries")
        .onInterface(kvpark::dbus_api::interface_name)
        .withArguments(Dict{{"namespace", sdbus::Variant(namespace_text)}})
        .storeResultsTo(entries, total);
    return entries;
  };
  const std::vector<Dict> full = list("00000000000000000000000000000007");
  ASSERT_EQ(full.size(), 2u);
  EXPECT_EQ(full[0].at("namespace").get<std::string>(), "00000000000000000000000000000007");
  EXPECT_EQ(full[0].at("evidence").get<std::string>(), "default_automatic");
  EXPECT_EQ(full[0].at("class").get<std::string>(), "private");
  EXPECT_EQ(full[0].at("tier").get<std::string>(), "host");
  EXPECT_EQ(full[0].at("kind").get<std::string>(), "block");
  EXPECT_EQ(list("7").size(), 2u) << "leading zeros may be left out";
  EXPECT_EQ(list("0x7").size(), 2u);
  EXPECT_EQ(list("0x00000000000000000000000000000008").size(), 1u);
  EXPECT_EQ(list("00000000000000000000000000000008")[0].at("class").get<std::string>(), "shared");
  for (const char* bad : {"", "0x", "g", "000000000000000000000000000000007"}) {
    EXPECT_THROW(list(bad), sdbus::Error) << "'" << bad << "' is not an id";
  }
}

TEST_F(DbusControl, MemoryPressureSignalledWhenEvictionCannotReachLowWater) {
  publish(7, 20);
  for (uint64_t id : entry_ids()) ASSERT_EQ(ctl({"pin", std::to_string(id)}).code, 0);
  auto bus = sdbus::createSessionBusConnection();
  auto proxy = sdbus::createProxy(*bus, kvpark::dbus_api::bus_name, kvpark::dbus_api::object_path);
  std::atomic<int> signals{0};
  std::atomic<uint64_t> free_bytes{0}, low_water_bytes{0};
  proxy->uponSignal("MemoryPressure")
      .onInterface(kvpark::dbus_api::interface_name)
      .call([&](uint64_t free_now, uint64_t low_water) {
        free_bytes = free_now;
        low_water_bytes = low_water;
        ++signals;
      });
  proxy->finishRegistration();
  bus->enterEventLoopAsync();
  // Every entry is pinned: eviction cannot free enough, so free stays below the mark.
  ASSERT_EQ(ctl({"set-limit", "arena-low-water", "63M"}).code, 0);
  EXPECT_TRUE(eventually("a MemoryPressure signal", [&] { return signals.load() >= 1; }));
  // The first signal is for this mark: none came while free bytes were above one.
  EXPECT_EQ(low_water_bytes.load(), 63u << 20) << "pressure signalled above the mark";
  EXPECT_LT(free_bytes.load(), 63u << 20);
  // Still one signal per crossing. A repeat has no event to wait for, so two more
  // sampling periods are watched; a slow machine only makes the watch weaker.
  constexpr int watch_msec =
      2 * static_cast<int>(kvpark::dbus_api::pressure_poll_usec / 1000) + 200;
  EXPECT_FALSE(wait_until([&] { return signals.load() > 1; }, watch_msec))
      << "MemoryPressure repeated while free bytes stayed below the mark";
  bus->leaveEventLoop();
  EXPECT_EQ(signals.load(), 1);
  EXPECT_EQ(json_number(ctl({"--json", "stats"}).out, "entries"), 20) << "pinned entries stay";
}

TEST_F(DbusControl, DropNamespaceRemovesOnlyItsEntries) {
  publish(7, 3);
  publish(8, 2);
  Result r = ctl({"--json", "drop-namespace", "7"});
  ASSERT_EQ(r.code, 0);
  EXPECT_EQ(json_number(r.out, "dropped"), 3) << r.out;
  EXPECT_EQ(json_number(ctl({"--json", "list"}).out, "total"), 2);
  EXPECT_EQ(ctl({"drop-namespace", "not-hex"}).code, 2);
}

class DbusPolicy : public DbusControl {
 protected:
  void SetUp() override { start_bus_and_daemon(built_binary("KVPARK_DBUS_POLICY")); }
};

TEST_F(DbusPolicy, PolicyFileRefusesUnprivilegedMutationAtTheBus) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run kvparkctl as nobody";
  publish(7, 1);
  const std::string id = std::to_string(entry_ids().at(0));
  EXPECT_EQ(ctl_as_nobody({"status"}).code, 0);
  EXPECT_EQ(ctl_as_nobody({"--json", "list"}).code, 0);
  EXPECT_EQ(ctl_as_nobody({"pin", id}).code, 4);
  EXPECT_NE(ctl({"show", id}).out.find("Pinned: no"), std::string::npos);
  EXPECT_EQ(ctl({"pin", id}).code, 0) << "root passes the policy";
}

TEST(DbusUnavailable, DaemonRunsWithoutBusAndCtlReportsUnavailable) {
  setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/kvpark-test-bus", 1);
  DaemonProcess daemon(DaemonConfig{.extra_args = {"--dbus", "session"}});
  ASSERT_TRUE(daemon.start()) << "a missing bus must not stop kvparkd";
  std::vector<std::string> argv = {built_binary("KVPARK_TEST_ENGINE"), "--socket",
                                   daemon.socket_path(), "--head-tokens", "64", "publish"};
  EXPECT_EQ(run_process(argv, command_timeout_msec, nullptr), 0) << "engines are served";
  // Nothing answers HTTP either (the test daemon serves none): unavailable.
  EXPECT_EQ(ctl({"--http", "127.0.0.1:1", "status"}).code, 5);
}

TEST(KvparkctlUsage, HelpListsVerbsAndExitCodes) {
  Result help = ctl({"--help"});
  EXPECT_EQ(help.code, 0);
  for (const char* word : {"status", "list", "pin ID", "flush", "set-limit NAME VALUE", "reload",
                           "Exit status", "4 permission denied", "5 daemon unavailable"}) {
    EXPECT_NE(help.out.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(ctl({"frobnicate"}).code, 2);
  EXPECT_EQ(ctl({}).code, 2);
  EXPECT_EQ(ctl({"show"}).code, 2);
}

}  // namespace
