// kvparkctl's surface against a real kvparkd: the HTTP fallback without a bus,
// one JSON schema for HTTP and --json (read as doubles), errors that name their
// cause, and table widths into a pipe and on a terminal.
//
// Each test starts its own kvparkd with HTTP on a free loopback port and, where a
// bus is wanted, its own dbus-daemon (tests/ops/dbus_bus.h). A test with no bus
// points both bus addresses at nothing, so the machine's own buses never answer.
#include <gtest/gtest.h>
#include <httplib.h>
#include <rapidjson/document.h>
#include <sys/statvfs.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "proto/json_schema.h"
#include "proto/version.h"
#include "tests/ops/ctl_runner.h"
#include "tests/ops/dbus_bus.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/eventually.h"

using namespace kvpark::testing;

namespace {

constexpr int command_timeout_msec = 20'000;
constexpr int incarnation_draws_max = 8;  // each below 2^53 with probability 2^-11
const char* const fallback_note = "reading kvparkd's HTTP status API at";

RunResult ctl(const std::vector<std::string>& args, unsigned tty_columns = 0,
              const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv = {built_binary("KVPARKCTL")};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_capture(argv, command_timeout_msec, tty_columns, env);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

rapidjson::Document parse(const std::string& text) {
  rapidjson::Document doc;
  doc.Parse(text.c_str());
  EXPECT_FALSE(doc.HasParseError()) << text;
  return doc;
}

// The string at doc[key] (or doc[array][0][key]); "" and a failure when it is not
// one, so a broken document fails the test instead of aborting it.
std::string string_at(const rapidjson::Value& doc, const char* key, const char* array = nullptr) {
  const rapidjson::Value* v = &doc;
  if (array != nullptr) {
    if (!v->IsObject() || !v->HasMember(array) || !(*v)[array].IsArray() || (*v)[array].Empty()) {
      ADD_FAILURE() << "no non-empty array '" << array << "'";
      return "";
    }
    v = &(*v)[array][0];
  }
  if (!v->IsObject() || !v->HasMember(key) || !(*v)[key].IsString()) {
    ADD_FAILURE() << "'" << key << "' is not a string";
    return "";
  }
  return (*v)[key].GetString();
}

// Every number in `v` is an integer a double holds exactly.
void expect_exact_as_double(const rapidjson::Value& v, const std::string& path) {
  if (v.IsObject()) {
    for (const auto& m : v.GetObject())
      expect_exact_as_double(m.value, path + "." + m.name.GetString());
  } else if (v.IsArray()) {
    for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
      expect_exact_as_double(v[i], path + "[" + std::to_string(i) + "]");
    }
  } else if (v.IsNumber()) {
    ASSERT_TRUE(v.IsUint64()) << path << " is not an unsigned integer";
    EXPECT_LE(v.GetUint64(), kvpark::json_schema::exact_integer_max)
        << path << " loses precision in a double";
  }
}

// Compares two documents as a double-precision reader sees them: same keys, same
// types, numbers equal as doubles. Keys in `moving` (clocks) only need to exist.
void expect_same_as_doubles(const rapidjson::Value& a, const rapidjson::Value& b,
                            const std::string& path, const std::vector<std::string>& moving) {
  ASSERT_EQ(a.GetType(), b.GetType()) << path;
  if (a.IsObject()) {
    ASSERT_EQ(a.MemberCount(), b.MemberCount()) << path;
    for (const auto& m : a.GetObject()) {
      const std::string key = m.name.GetString();
      ASSERT_TRUE(b.HasMember(key.c_str())) << path << "." << key << " only on one side";
      if (std::find(moving.begin(), moving.end(), key) != moving.end()) continue;
      expect_same_as_doubles(m.value, b[key.c_str()], path + "." + key, moving);
    }
  } else if (a.IsArray()) {
    ASSERT_EQ(a.Size(), b.Size()) << path;
    for (rapidjson::SizeType i = 0; i < a.Size(); ++i) {
      expect_same_as_doubles(a[i], b[i], path + "[" + std::to_string(i) + "]", moving);
    }
  } else if (a.IsNumber()) {
    EXPECT_EQ(a.GetDouble(), b.GetDouble()) << path;
  } else if (a.IsString()) {
    EXPECT_STREQ(a.GetString(), b.GetString()) << path;
  } else if (a.IsBool()) {
    EXPECT_EQ(a.GetBool(), b.GetBool()) << path;
  }
}

class CtlSurface : public ::testing::Test {
 protected:
  void TearDown() override {
    daemon_.reset();
    bus_.reset();
    unsetenv("DBUS_SESSION_BUS_ADDRESS");
    unsetenv("DBUS_SYSTEM_BUS_ADDRESS");
  }

  // A private bus the daemon joins; kvparkctl --user finds it.
  void start_bus() {
    if (!PrivateBus::available()) GTEST_SKIP() << "dbus-daemon is not installed";
    bus_ = std::make_unique<PrivateBus>();
    ASSERT_TRUE(bus_->running()) << "the private dbus-daemon did not start";
    setenv("DBUS_SESSION_BUS_ADDRESS", bus_->address().c_str(), 1);
    setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/kvpark-test-system-bus", 1);
  }
  // No bus anywhere for the daemon or kvparkctl.
  void no_bus() {
    setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/kvpark-test-session-bus", 1);
    setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/kvpark-test-system-bus", 1);
  }

  void start_daemon(const std::string& dbus, std::vector<std::string> extra = {},
                    uint64_t arena_bytes = 64ull << 20) {
    std::vector<std::string> args = {"--dbus", dbus, "--http-listen", "127.0.0.1:0"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_ = std::make_unique<DaemonProcess>(
        DaemonConfig{.arena_bytes = arena_bytes, .extra_args = args});
    ASSERT_TRUE(daemon_->start());
    ASSERT_GT(daemon_->http_port(), 0) << "READY=1 named no HTTP port";
  }

  std::string http_address() const { return "127.0.0.1:" + std::to_string(daemon_->http_port()); }

  std::string http_get(const std::string& path) {
    httplib::Client client("127.0.0.1", daemon_->http_port());
    auto res = client.Get(path.c_str());
    EXPECT_TRUE(res) << path;
    if (!res) return "";
    EXPECT_EQ(res->status, 200) << path << ": " << res->body;
    return res->body;
  }

  void publish(uint64_t ns, size_t blocks, bool shared = false) {
    std::vector<std::string> argv = {built_binary("KVPARK_TEST_ENGINE"),
                                     "--socket",
                                     daemon_->socket_path(),
                                     "--ns",
                                     std::to_string(ns),
                                     "--head-tokens",
                                     std::to_string(blocks * 64),
                                     "--head-seed",
                                     std::to_string(ns * 100 + blocks)};
    if (shared) argv.push_back("--shared");
    argv.push_back("publish");
    ASSERT_EQ(run_process(argv, command_timeout_msec, nullptr), 0);
  }

  std::unique_ptr<PrivateBus> bus_;
  std::unique_ptr<DaemonProcess> daemon_;
};

// --- without a bus -------------------------------------------------------------

TEST_F(CtlSurface, ReadVerbsFallBackToHttpWhenThereIsNoBusAndSaySoOnce) {
  no_bus();
  start_daemon("off");
  publish(7, 3);
  const RunResult status = ctl({"--http", http_address(), "status"});
  ASSERT_EQ(status.code, 0) << status.err;
  EXPECT_TRUE(contains(status.out, std::string("kvparkd ") + kvpark::version)) << status.out;
  EXPECT_TRUE(contains(status.out, "Entries: 3 (3 blocks")) << status.out;
  const std::vector<std::string> notes = lines_of(status.err);
  ASSERT_EQ(notes.size(), 1u) << status.err;
  EXPECT_TRUE(contains(notes[0], fallback_note)) << notes[0];
  EXPECT_TRUE(contains(notes[0], http_address())) << notes[0];

  for (const char* verb : {"stats", "namespaces", "list"}) {
    const RunResult r = ctl({"--http", http_address(), verb});
    EXPECT_EQ(r.code, 0) << verb << ": " << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << verb << ": " << r.err;
  }
  EXPECT_TRUE(contains(ctl({"--http", http_address(), "list"}).out, "3 of 3 entries listed."));
  const RunResult list = ctl({"--http", http_address(), "--json", "list"});
  const rapidjson::Document page = parse(list.out);
  ASSERT_TRUE(page.IsObject() && page.HasMember("entries") && page["entries"].IsArray());
  ASSERT_EQ(page["entries"].Size(), 3u);
  const std::string id = string_at(page, "id", "entries");
  const RunResult show = ctl({"--http", http_address(), "show", id});
  EXPECT_EQ(show.code, 0) << show.err;
  EXPECT_TRUE(contains(show.out, "Kind: block")) << show.out;
  EXPECT_EQ(ctl({"--http", http_address(), "show", "999999"}).code, 3) << "not found over HTTP";
}

TEST_F(CtlSurface, ReadVerbsFallBackToHttpWhenKvparkdIsNotOnTheBus) {
  start_bus();
  start_daemon("off");
  const RunResult r = ctl({"--user", "--http", http_address(), "status"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "not on the session bus")) << r.err;
  EXPECT_TRUE(contains(r.err, fallback_note)) << r.err;
}

TEST_F(CtlSurface, MutatingVerbWithoutBusNamesEveryFix) {
  no_bus();
  start_daemon("off");
  const RunResult r = ctl({"--http", http_address(), "pin", "1"});
  EXPECT_EQ(r.code, 5);
  EXPECT_EQ(r.out, "");
  for (const char* fix : {"systemctl", "kvparkctl --user", "dbus-run-session", "--dbus off",
                          "--http HOST:PORT", "pin needs D-Bus"}) {
    EXPECT_TRUE(contains(r.err, fix)) << fix << " missing from: " << r.err;
  }
  EXPECT_FALSE(contains(r.err, fallback_note)) << "a mutating verb never goes to HTTP";
}

TEST_F(CtlSurface, NeitherBusNorHttpIsUnavailableWithExitFive) {
  no_bus();
  start_daemon("off");
  const std::string closed = http_address();
  daemon_.reset();  // its port is closed now
  const RunResult r = ctl({"--http", closed, "status"});
  EXPECT_EQ(r.code, 5);
  EXPECT_EQ(r.out, "");
  EXPECT_TRUE(contains(r.err, "nothing answers HTTP at " + closed)) << r.err;
  EXPECT_TRUE(contains(r.err, "dbus-run-session")) << r.err;
}

// --- one JSON schema ------------------------------------------------------------

TEST_F(CtlSurface, HttpAndCtlJsonAreOneSchemaReadAsDoubles) {
  start_bus();
  // The incarnation is random: draw until it is past 2^53, where a double-precision
  // reader would corrupt it if it were a number.
  std::string incarnation;
  for (int draw = 0; draw < incarnation_draws_max; ++draw) {
    start_daemon("session");
    incarnation = string_at(parse(http_get("/v1/status")), "incarnation");
    ASSERT_FALSE(incarnation.empty());
    if (std::stoull(incarnation, nullptr, 16) > kvpark::json_schema::exact_integer_max) break;
    daemon_.reset();
  }
  ASSERT_TRUE(daemon_) << "no incarnation above 2^53 in " << incarnation_draws_max << " draws";
  ASSERT_EQ(incarnation.size(), 16u);
  publish(7, 3);
  publish(8, 2, /*shared=*/true);
  const RunResult list = ctl({"--user", "--json", "list", "--limit", "1000"});
  ASSERT_EQ(list.code, 0) << list.err;
  const std::string id = string_at(parse(list.out), "id", "entries");
  ASSERT_FALSE(id.empty());

  struct Pair {
    std::vector<std::string> ctl_args;
    std::string path;
  };
  const Pair pairs[] = {
      {{"status"}, "/v1/status"},
      {{"namespaces"}, "/v1/namespaces"},
      {{"list", "--limit", "1000"}, "/v1/entries?limit=1000"},
      {{"list", "--limit", "2", "--offset", "1", "--class", "private"},
       "/v1/entries?limit=2&offset=1&class=private"},
      {{"show", id}, "/v1/entries/" + id},
  };
  for (const Pair& p : pairs) {
    std::vector<std::string> args = {"--user", "--json"};
    args.insert(args.end(), p.ctl_args.begin(), p.ctl_args.end());
    const RunResult r = ctl(args);
    ASSERT_EQ(r.code, 0) << p.path << ": " << r.err;
    EXPECT_EQ(r.err, "") << "D-Bus reached: no fallback note";
    const rapidjson::Document from_ctl = parse(r.out);
    const rapidjson::Document from_http = parse(http_get(p.path));
    SCOPED_TRACE(p.path);
    expect_exact_as_double(from_ctl, "ctl");
    expect_exact_as_double(from_http, "http");
    expect_same_as_doubles(from_ctl, from_http, p.path, {"uptime_usec", "idle_usec"});
  }
  const rapidjson::Document status = parse(ctl({"--user", "--json", "status"}).out);
  EXPECT_EQ(string_at(status, "incarnation"), incarnation);
  const rapidjson::Document entry = parse(ctl({"--user", "--json", "show", id}).out);
  EXPECT_EQ(string_at(entry, "id"), id);
  string_at(entry, "creator_session");
  EXPECT_EQ(string_at(entry, "key_hash").size(), 32u);

  // stats: the status figures and the incarnation, nothing as a bare 64-bit number.
  const rapidjson::Document stats = parse(ctl({"--user", "--json", "stats"}).out);
  expect_exact_as_double(stats, "stats");
  EXPECT_EQ(string_at(stats, "incarnation"), incarnation);
  ASSERT_TRUE(stats.HasMember("entries") && stats["entries"].IsUint64());
  EXPECT_EQ(stats["entries"].GetUint64(), 5u);
  EXPECT_FALSE(stats.HasMember("version")) << "stats holds figures only";
}

// --- errors that explain ---------------------------------------------------------

TEST_F(CtlSurface, SetLimitRefusalsNameTheCauseAndTheRange) {
  start_bus();
  start_daemon("session");
  const RunResult low = ctl({"--user", "set-limit", "arena-low-water", "2G"});
  EXPECT_EQ(low.code, 2);
  EXPECT_TRUE(
      contains(low.err, "arena-low-water 2G is larger than the arena (64M): allowed 0 to 64M"))
      << low.err;
  EXPECT_EQ(ctl({"--user", "set-limit", "arena-low-water", "64M"}).code, 0) << "N: the arena";
  EXPECT_EQ(ctl({"--user", "set-limit", "arena-low-water", "67108865"}).code, 2) << "N+1";

  const RunResult unknown = ctl({"--user", "set-limit", "foo", "1G"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(contains(unknown.err, "unknown limit 'foo'")) << unknown.err;
  for (const char* name :
       {"arena-low-water", "reservation-max", "disk-capacity", "disk-write-budget"}) {
    EXPECT_TRUE(contains(unknown.err, name)) << unknown.err;
  }

  const RunResult reservation = ctl({"--user", "set-limit", "reservation-max", "1G"});
  EXPECT_EQ(reservation.code, 2);
  EXPECT_TRUE(contains(reservation.err, "reservation-max 1G is larger than the arena (64M)"))
      << reservation.err;
  EXPECT_EQ(ctl({"--user", "set-limit", "reservation-max", "64M"}).code, 0);
  EXPECT_EQ(ctl({"--user", "set-limit", "reservation-max", "67108865"}).code, 2);
  EXPECT_EQ(ctl({"--user", "set-limit", "reservation-max", "4K"}).code, 0);
  EXPECT_TRUE(contains(ctl({"--user", "set-limit", "reservation-max", "4095"}).err,
                       "smaller than one extent"));

  const RunResult disk = ctl({"--user", "set-limit", "disk-capacity", "1G"});
  EXPECT_EQ(disk.code, 1);
  EXPECT_TRUE(contains(disk.err, "without a disk tier")) << disk.err;
  const RunResult size = ctl({"--user", "set-limit", "arena-low-water", "lots"});
  EXPECT_EQ(size.code, 2);
  EXPECT_TRUE(contains(size.err, "not a size: lots")) << size.err;
  // kvparkd.conf's grammar (proto/size.h): no fractions, IEC spellings too.
  EXPECT_TRUE(contains(ctl({"--user", "set-limit", "arena-low-water", "1.5M"}).err, "not a size"));
  EXPECT_EQ(ctl({"--user", "set-limit", "arena-low-water", "3MiB"}).code, 0);
}

TEST_F(CtlSurface, DiskCapacityLargerThanItsFileSystemIsRefusedWithTheFigure) {
  start_bus();
  char templ[] = "/var/tmp/kvpark-ctl-test-XXXXXX";
  const std::string dir = mkdtemp(templ);
  start_daemon("session", {"--disk-dir", dir});
  struct statvfs fs {};
  ASSERT_EQ(statvfs(dir.c_str(), &fs), 0);
  const uint64_t fs_bytes = uint64_t(fs.f_blocks) * fs.f_frsize;
  EXPECT_EQ(ctl({"--user", "set-limit", "disk-capacity", std::to_string(fs_bytes)}).code, 0)
      << "N: the whole file system";
  const RunResult over =
      ctl({"--user", "set-limit", "disk-capacity", std::to_string(fs_bytes + 1)});
  EXPECT_EQ(over.code, 2) << "N+1";
  EXPECT_TRUE(contains(over.err, "is larger than the file system holding " + dir)) << over.err;
  EXPECT_TRUE(contains(over.err, std::to_string(fs_bytes))) << over.err;
  daemon_.reset();
  std::filesystem::remove_all(dir);
}

// A capacity lowered at run time takes records at once, chain tips first, without
// waiting for a spill to complete (there is none here).
TEST_F(CtlSurface, LoweringDiskCapacityTakesRecordsAtOnce) {
  start_bus();
  char templ[] = "/var/tmp/kvpark-ctl-test-XXXXXX";
  const std::string dir = mkdtemp(templ);
  start_daemon("session", {"--disk-dir", dir});
  constexpr size_t blocks = 16, kept = 4;
  publish(9, blocks, /*shared=*/true);  // written through
  StatsClient stats(daemon_->socket_path());
  uint64_t entries = 0, bytes = 0;
  const auto read_disk = [&] {
    const kvpark_stats st = stats.get();
    entries = st.disk_entries;
    bytes = st.disk_bytes;
  };
  ASSERT_TRUE(eventually("the head is on disk", [&] {
    read_disk();
    return entries == blocks;
  }));
  const uint64_t capacity = bytes / blocks * kept;  // records of one size
  ASSERT_EQ(ctl({"--user", "set-limit", "disk-capacity", std::to_string(capacity)}).code, 0);
  EXPECT_TRUE(eventually("the tier fits its new capacity", [&] {
    read_disk();
    return bytes <= capacity;
  })) << entries << " records, " << bytes << " bytes";
  EXPECT_EQ(entries, kept);
  daemon_.reset();
  std::filesystem::remove_all(dir);
}

TEST_F(CtlSurface, EvictOfAPinnedEntrySaysItIsPinned) {
  start_bus();
  start_daemon("session");
  publish(7, 1);
  const std::string id = string_at(parse(ctl({"--user", "--json", "list"}).out), "id", "entries");
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(ctl({"--user", "pin", id}).code, 0);
  const RunResult r = ctl({"--user", "evict", id});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "entry " + id + " is pinned: unpin it first")) << r.err;
  EXPECT_FALSE(contains(r.err, "bad state")) << r.err;
}

TEST_F(CtlSurface, EvictOfALeasedEntrySaysWhatHoldsIt) {
  start_bus();
  start_daemon("session");
  publish(7, 2);  // a restore leaves one token to prefill: the reader restores block 1
  const rapidjson::Document page = parse(ctl({"--user", "--json", "list"}).out);
  ASSERT_TRUE(page.IsObject() && page.HasMember("entries") && page["entries"].IsArray());
  std::string id;
  for (const auto& e : page["entries"].GetArray()) {
    if (e["position"].GetUint64() == 64) id = e["id"].GetString();
  }
  ASSERT_FALSE(id.empty()) << "no entry at position 64";
  ChildProcess reader = spawn_process({built_binary("KVPARK_TEST_ENGINE"), "--socket",
                                       daemon_->socket_path(), "--ns", "7", "--head-tokens", "128",
                                       "--head-seed", "702", "hold-lease"});
  ASSERT_TRUE(reader.wait_for_line("ready", command_timeout_msec));
  const RunResult r = ctl({"--user", "evict", id});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "entry " + id + " is in use: 1 lease(s)")) << r.err;
  reader.kill_hard();
}

TEST_F(CtlSurface, ReloadWithoutAFileSaysThereIsNone) {
  if (std::filesystem::exists("/etc/kvpark/kvparkd.conf")) {
    GTEST_SKIP() << "/etc/kvpark/kvparkd.conf exists on this machine";
  }
  start_bus();
  start_daemon("session");
  const RunResult r = ctl({"--user", "reload"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(contains(r.out, "reloaded /etc/kvpark/kvparkd.conf")) << r.out;
  EXPECT_TRUE(contains(r.out, "no configuration file at /etc/kvpark/kvparkd.conf")) << r.out;
}

// --- table widths -----------------------------------------------------------------

TEST_F(CtlSurface, TablesAreFullWidthIntoAPipeAndFitATerminal) {
  no_bus();
  start_daemon("off");
  publish(7, 3);
  const std::vector<std::string> args = {"--http", http_address(), "list"};
  const RunResult piped = ctl(args);
  ASSERT_EQ(piped.code, 0) << piped.err;
  size_t widest = 0;
  for (const std::string& line : lines_of(piped.out))
    widest = std::max(widest, display_columns(line));
  EXPECT_GT(widest, 80u) << "piped: the 32-digit keys are not cut\n" << piped.out;
  EXPECT_FALSE(contains(piped.out, "…")) << piped.out;

  const RunResult narrow = ctl(args, /*tty_columns=*/80);
  ASSERT_EQ(narrow.code, 0) << narrow.err;
  EXPECT_TRUE(contains(narrow.out, "…")) << "cut to the terminal\n" << narrow.out;
  for (const std::string& line : lines_of(narrow.out)) {
    EXPECT_LE(display_columns(line), 80u) << line;
  }
  const RunResult full = ctl({"--http", http_address(), "--full", "list"}, 80);
  EXPECT_FALSE(contains(full.out, "…")) << "--full on a terminal\n" << full.out;
  const RunResult columns = ctl(args, 0, {"COLUMNS=80"});
  for (const std::string& line : lines_of(columns.out)) {
    EXPECT_LE(display_columns(line), 80u) << "$COLUMNS honoured in a pipe: " << line;
  }
}

}  // namespace
