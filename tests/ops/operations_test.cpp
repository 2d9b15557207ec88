// Running kvparkd and kvpark-proxy as a service: what --print-config says is what runs,
// /health tells ready from degraded, /metrics carries the standard process_* families,
// the day's disk writes survive a restart, and the log has start and stop lines with
// journal priority prefixes only when stderr is the journal. Real processes, real HTTP,
// a real disk tier on a real file system.
#include <gtest/gtest.h>
#include <httplib.h>
#include <rapidjson/document.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "proto/version.h"
#include "tests/ops/json_body.h"
#include "tests/ops/prometheus_parser.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t usec_per_day = 86'400ull * 1'000'000;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double unix_seconds() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

uint64_t utc_day() {
  using namespace std::chrono;
  return uint64_t(duration_cast<microseconds>(system_clock::now().time_since_epoch()).count()) /
         usec_per_day;
}

// A directory on a real file system (the disk tier needs O_DIRECT: not tmpfs).
class ScratchDirectory {
 public:
  ScratchDirectory() {
    char templ[] = "/var/tmp/kvpark-ops-test-XXXXXX";
    path_ = mkdtemp(templ);
  }
  ~ScratchDirectory() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct Fetched {
  int status = -1;
  std::string body;
};

Fetched get(int port, const std::string& path) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  Fetched f;
  if (httplib::Result r = client.Get(path.c_str())) {
    f.status = r->status;
    f.body = r->body;
  }
  return f;
}

uint64_t status_number(int port, const char* key) {
  const rapidjson::Document d = json(get(port, "/v1/status").body);
  return d.IsObject() && d.HasMember(key) && d[key].IsUint64() ? d[key].GetUint64() : ~0ull;
}

// `key = value` lines of --print-config.
std::map<std::string, std::string> print_config(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {built_binary("KVPARKD"), "--print-config"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  EXPECT_EQ(run_process(argv, 20'000, &out), 0) << out;
  std::map<std::string, std::string> values;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const size_t equals = line.find(" = ");
    if (line.empty() || line[0] == '#' || equals == std::string::npos) continue;
    values[line.substr(0, equals)] = line.substr(equals + 3);
  }
  return values;
}

uint64_t size_bytes(const std::string& text) {
  const uint64_t number = std::stoull(text);
  switch (text.back()) {
    case 'K': return number << 10;
    case 'M': return number << 20;
    case 'G': return number << 30;
    case 'T': return number << 40;
    default: return number;
  }
}

// The daemon started with `args` on top of DaemonProcess's own, HTTP on a free port.
std::unique_ptr<DaemonProcess> start_daemon(std::vector<std::string> args, uint64_t arena_bytes,
                                            std::vector<std::string> env = {}) {
  args.insert(args.begin(), {"--config", "/dev/null", "--http-listen", "127.0.0.1:0"});
  auto daemon = std::make_unique<DaemonProcess>(
      DaemonConfig{.arena_bytes = arena_bytes, .extra_args = args, .env = env});
  EXPECT_TRUE(daemon->start()) << read_file(daemon->log_path());
  EXPECT_GT(daemon->http_port(), 0) << read_file(daemon->log_path());
  return daemon;
}

bool disk_tier_off(const DaemonProcess& daemon) {
  return read_file(daemon.log_path()).find("disk tier off") != std::string::npos;
}

// --print-config and the running daemon agree, with and without a disk tier (where the
// low-water mark is derived from the arena).
TEST(PrintConfig, PrintsWhatTheRunningDaemonReports) {
  ScratchDirectory disk;
  for (const bool with_disk : {false, true}) {
    SCOPED_TRACE(with_disk ? "with --disk-dir" : "without a disk tier");
    std::vector<std::string> args = {"--arena-size", "64M", "--disk-dir",
                                     with_disk ? disk.path() : "off", "--state-dir", "off"};
    std::vector<std::string> printed_args = args;
    printed_args.insert(printed_args.begin(), {"--config", "/dev/null"});
    const auto printed = print_config(printed_args);
    auto daemon = start_daemon(args, 64ull << 20);
    ASSERT_TRUE(daemon->running());
    if (with_disk && disk_tier_off(*daemon)) GTEST_SKIP() << read_file(daemon->log_path());
    const int port = daemon->http_port();
    EXPECT_EQ(size_bytes(printed.at("arena_low_water")), status_number(port, "arena_low_water_bytes"));
    EXPECT_EQ(size_bytes(printed.at("reservation_max")), status_number(port, "reservation_bytes_max"));
    EXPECT_EQ(size_bytes(printed.at("arena_size")), status_number(port, "arena_data_bytes"));
    if (with_disk) {
      EXPECT_EQ(printed.at("arena_low_water"), "8M") << "1/8 of the arena with a disk tier";
      EXPECT_EQ(size_bytes(printed.at("disk_write_budget_per_day")),
                status_number(port, "disk_write_budget_bytes_per_day"));
    } else {
      EXPECT_EQ(printed.at("arena_low_water"), "0");
    }
  }
}

// --help's defaults come from the same code: with a 1G default arena, 128M.
TEST(PrintConfig, HelpShowsTheDerivedDefaults) {
  std::string out;
  ASSERT_EQ(run_process({built_binary("KVPARKD"), "--help"}, 20'000, &out), 0);
  EXPECT_NE(out.find("default half the arena: 512M"), std::string::npos) << out;
  EXPECT_NE(out.find("with a disk tier 1/8 of the arena: 128M"), std::string::npos) << out;
}

TEST(Health, ReadyWhenServingEveryConfiguredTier) {
  ScratchDirectory disk;
  auto daemon = start_daemon({"--disk-dir", disk.path()}, 16ull << 20);
  ASSERT_TRUE(daemon->running());
  if (disk_tier_off(*daemon)) GTEST_SKIP() << read_file(daemon->log_path());
  const Fetched f = get(daemon->http_port(), "/health");
  EXPECT_EQ(f.status, 200) << f.body;
  EXPECT_EQ(f.body, "{\"status\":\"ready\"}\n");
}

TEST(Health, DegradedWhenTheDiskTierDidNotStart) {
  ScratchDirectory scratch;
  const std::string not_a_directory = scratch.path() + "/file";
  std::ofstream(not_a_directory) << "x";
  auto daemon = start_daemon({"--disk-dir", not_a_directory + "/disk"}, 16ull << 20);
  ASSERT_TRUE(daemon->running());
  const Fetched f = get(daemon->http_port(), "/health");
  EXPECT_EQ(f.status, 503) << f.body;
  const rapidjson::Document d = json(f.body);
  ASSERT_TRUE(d.IsObject() && d.HasMember("status") && d.HasMember("reasons")) << f.body;
  EXPECT_STREQ(d["status"].GetString(), "degraded");
  ASSERT_EQ(d["reasons"].Size(), 1u) << f.body;
  const std::string reason = d["reasons"][0].GetString();
  EXPECT_NE(reason.find("disk tier off"), std::string::npos) << reason;
  EXPECT_NE(reason.find(not_a_directory), std::string::npos) << "names the directory: " << reason;
}

// Checks the six process_* families of a /metrics page against /proc/PID.
void expect_process_metrics(const std::string& text, pid_t pid, double started_after) {
  PromDocument doc;
  std::string error;
  ASSERT_TRUE(parse_prometheus_text(text, doc, error)) << error << "\n" << text;
  const std::map<std::string, std::string> none;
  double start = 0, cpu = 0, open_fds = 0, max_fds = 0, rss = 0, vsize = 0;
  ASSERT_TRUE(doc.value("process_start_time_seconds", none, start)) << text;
  ASSERT_TRUE(doc.value("process_cpu_seconds_total", none, cpu));
  ASSERT_TRUE(doc.value("process_open_fds", none, open_fds));
  ASSERT_TRUE(doc.value("process_max_fds", none, max_fds));
  ASSERT_TRUE(doc.value("process_resident_memory_bytes", none, rss));
  ASSERT_TRUE(doc.value("process_virtual_memory_bytes", none, vsize));
  EXPECT_EQ(doc.families.at("process_cpu_seconds_total").type, "counter");
  EXPECT_EQ(doc.families.at("process_open_fds").type, "gauge");
  // Started between the test's mark and now (a clock tick of slack either side).
  EXPECT_GE(start, started_after - 1.0);
  EXPECT_LE(start, unix_seconds() + 1.0);
  // What /proc says now.
  size_t fds_now = 0;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd")) {
    (void)e;
    ++fds_now;
  }
  EXPECT_GT(open_fds, 2.0);
  EXPECT_LE(std::fabs(open_fds - double(fds_now)), 16.0) << "about /proc/PID/fd's " << fds_now;
  rlimit files{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &files), 0);
  EXPECT_EQ(max_fds, double(files.rlim_cur));
  std::istringstream statm(read_file("/proc/" + std::to_string(pid) + "/statm"));
  uint64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  const double page = double(sysconf(_SC_PAGESIZE));
  EXPECT_GT(rss, 0.0);
  EXPECT_GE(vsize, rss);
  EXPECT_NEAR(vsize, double(size_pages) * page, double(size_pages) * page * 0.5);
  EXPECT_NEAR(rss, double(resident_pages) * page, double(resident_pages) * page * 0.5);
  EXPECT_GE(cpu, 0.0);
  EXPECT_LT(cpu, 600.0);
}

TEST(ProcessMetrics, KvparkdReportsItsProcess) {
  const double mark = unix_seconds();
  auto daemon = start_daemon({}, 16ull << 20);
  ASSERT_TRUE(daemon->running());
  const Fetched f = get(daemon->http_port(), "/metrics");
  ASSERT_EQ(f.status, 200);
  expect_process_metrics(f.body, daemon->pid(), mark);
}

// kvpark-proxy in front of an upstream nobody serves: it answers /metrics anyway.
class ProxyProcess {
 public:
  explicit ProxyProcess(const std::string& daemon_socket) {
    log_path_ = scratch_.path() + "/proxy.log";
    port_ = free_tcp_port();  // the proxy takes no port 0; a port taken meanwhile fails it
    const int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    pid_ = spawn({built_binary("KVPARK_PROXY"), "--listen", "127.0.0.1:" + std::to_string(port_),
                  "--upstream", "model=http://127.0.0.1:9", "--slot-dir", scratch_.path() + "/slots",
                  "--socket", daemon_socket},
                 log_fd, log_fd);
    close(log_fd);
  }
  ~ProxyProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // Its port once the "started: listening on" line is out; -1 when it exited first.
  int wait_port() {
    bool listening = false;
    wait_until([&] {
      listening = log().find("started: listening on http://") != std::string::npos;
      return listening || waitpid(pid_, nullptr, WNOHANG) == pid_;
    });
    return listening ? port_ : -1;
  }
  int stop() {
    ::kill(pid_, SIGTERM);
    const int status = wait_with_timeout(pid_, 30'000);
    if (status != -1) pid_ = -1;
    return status;
  }
  pid_t pid() const { return pid_; }
  std::string log() const { return read_file(log_path_); }

 private:
  ScratchDirectory scratch_;
  std::string log_path_;
  int port_ = -1;
  pid_t pid_ = -1;
};

TEST(ProcessMetrics, KvparkProxyReportsItsProcess) {
  if (built_binary("KVPARK_PROXY").empty()) GTEST_SKIP() << "KVPARK_PROXY is not set";
  const double mark = unix_seconds();
  auto daemon = start_daemon({}, 16ull << 20);
  ProxyProcess proxy(daemon->socket_path());
  const int port = proxy.wait_port();
  ASSERT_GT(port, 0) << proxy.log();
  const Fetched f = get(port, "/metrics");
  ASSERT_EQ(f.status, 200) << f.body;
  expect_process_metrics(f.body, proxy.pid(), mark);
}

// Spills a shared head (written through) and waits until the day's count shows it.
uint64_t spill_shared_head(const DaemonProcess& daemon, uint64_t seed) {
  const EngineRun run = run_engine(daemon, {"--shared", "--head-seed", std::to_string(seed),
                                            "--head-tokens", "512", "--block-bytes", "65536",
                                            "publish"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  uint64_t written = 0;
  EXPECT_TRUE(wait_until([&] {
    written = status_number(daemon.http_port(), "disk_written_today_bytes");
    return status_number(daemon.http_port(), "spills") >= 8 && written > 0;
  })) << read_file(daemon.log_path());
  return written;
}

TEST(DiskWriteBudget, WrittenTodaySurvivesARestartAndACrash) {
  ScratchDirectory disk;
  const std::vector<std::string> args = {"--disk-dir", disk.path()};
  auto daemon = start_daemon(args, 16ull << 20);
  ASSERT_TRUE(daemon->running());
  if (disk_tier_off(*daemon)) GTEST_SKIP() << read_file(daemon->log_path());
  const uint64_t first = spill_shared_head(*daemon, 1);
  ASSERT_GT(first, 0u);
  // A clean stop saves it; the next daemon starts from it and counts on.
  ASSERT_EQ(daemon->stop(), 0) << read_file(daemon->log_path());
  daemon = start_daemon(args, 16ull << 20);
  EXPECT_EQ(status_number(daemon->http_port(), "disk_written_today_bytes"), first);
  const uint64_t second = spill_shared_head(*daemon, 2);
  EXPECT_GT(second, first);
  // A crash keeps what was saved (the daemon saves while the count changes).
  const std::string saved = disk.path() + "/written-today";
  ASSERT_TRUE(wait_until([&] {
    return read_file(saved).find("bytes " + std::to_string(second) + "\n") != std::string::npos;
  })) << read_file(saved);
  daemon->kill_hard();
  daemon = start_daemon(args, 16ull << 20);
  EXPECT_EQ(status_number(daemon->http_port(), "disk_written_today_bytes"), second);
}

TEST(DiskWriteBudget, AnotherDaysCountStartsFromZero) {
  ScratchDirectory disk;
  const std::vector<std::string> args = {"--disk-dir", disk.path()};
  for (const bool today : {false, true}) {
    SCOPED_TRACE(today ? "saved today" : "saved yesterday");
    std::ofstream(disk.path() + "/written-today")
        << "kvpark-disk-written-today 1\nday " << (today ? utc_day() : utc_day() - 1)
        << "\nbytes 12345\n";
    auto daemon = start_daemon(args, 16ull << 20);
    ASSERT_TRUE(daemon->running());
    if (disk_tier_off(*daemon)) GTEST_SKIP() << read_file(daemon->log_path());
    EXPECT_EQ(status_number(daemon->http_port(), "disk_written_today_bytes"), today ? 12345u : 0u);
    daemon->kill_hard();
  }
}

// Lines of `log` that start with a journal priority prefix "<N>".
size_t prefixed_lines(const std::string& log) {
  size_t n = 0;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    n += line.size() > 3 && line[0] == '<' && std::isdigit(static_cast<unsigned char>(line[1])) &&
         line[2] == '>';
  }
  return n;
}

TEST(LogLines, KvparkdSaysStartedAndStoppedWithoutPrefixesOnAPlainFile) {
  auto daemon = start_daemon({}, 16ull << 20);
  ASSERT_TRUE(daemon->running());
  ASSERT_EQ(daemon->stop(), 0);
  const std::string log = read_file(daemon->log_path());
  EXPECT_NE(log.find(std::string("kvparkd ") + version + " started: listening on " +
                     daemon->socket_path() + ", http on 127.0.0.1:"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("kvparkd: stopping on SIGTERM\n"), std::string::npos) << log;
  EXPECT_NE(log.find("kvparkd: stopped\n"), std::string::npos) << log;
  EXPECT_EQ(prefixed_lines(log), 0u) << log;
}

// With $JOURNAL_STREAM naming stderr's device and inode (as systemd sets it when
// stderr is the journal), every line carries its priority; naming another file, none.
TEST(LogLines, KvparkdPrefixesPrioritiesOnlyForTheJournal) {
  for (const bool journal : {true, false}) {
    SCOPED_TRACE(journal ? "stderr is the journal" : "JOURNAL_STREAM names another file");
    auto daemon = std::make_unique<DaemonProcess>(
        DaemonConfig{.arena_bytes = 16ull << 20, .extra_args = {"--config", "/dev/null"}});
    // The daemon's stderr is this file (opened for appending at start).
    std::ofstream(daemon->log_path()).flush();
    struct stat st {};
    ASSERT_EQ(stat(journal ? daemon->log_path().c_str() : "/dev/null", &st), 0);
    daemon->config().env = {"JOURNAL_STREAM=" + std::to_string(st.st_dev) + ":" +
                            std::to_string(st.st_ino)};
    ASSERT_TRUE(daemon->start());
    ASSERT_EQ(daemon->stop(), 0);
    const std::string log = read_file(daemon->log_path());
    EXPECT_EQ(log.find("<6>kvparkd: stopped\n") != std::string::npos, journal) << log;
    EXPECT_EQ(prefixed_lines(log) > 0, journal) << log;
  }
}

TEST(LogLines, KvparkProxySaysStartedStoppingAndStopped) {
  if (built_binary("KVPARK_PROXY").empty()) GTEST_SKIP() << "KVPARK_PROXY is not set";
  auto daemon = start_daemon({}, 16ull << 20);
  ProxyProcess proxy(daemon->socket_path());
  ASSERT_GT(proxy.wait_port(), 0) << proxy.log();
  const int status = proxy.stop();
  ASSERT_NE(status, -1) << "kvpark-proxy did not stop on SIGTERM: " << proxy.log();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string log = proxy.log();
  EXPECT_NE(log.find(std::string("kvpark-proxy ") + version + " started: listening on http://"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("kvpark-proxy: stopping on SIGTERM\n"), std::string::npos) << log;
  EXPECT_NE(log.find("kvpark-proxy: stopped\n"), std::string::npos) << log;
  EXPECT_EQ(prefixed_lines(log), 0u) << log;
}

}  // namespace
}  // namespace kvpark::testing
