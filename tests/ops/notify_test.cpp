// The systemd notify protocol, checked with a NOTIFY_SOCKET this test owns:
// READY=1 only once the engine socket accepts, STATUS= lines, WATCHDOG=1 pings at
// about half of WATCHDOG_USEC, STOPPING=1 at SIGTERM.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tests/testing/daemon_process.h"
#include "tests/testing/engine_runner.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

uint64_t now_msec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1'000'000;
}

bool socket_accepts(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

// A notify socket in a private directory, and a kvparkd started with it.
class NotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/kvpark-notify-XXXXXX";
    directory_ = mkdtemp(templ);
    notify_path_ = directory_ + "/notify";
    socket_path_ = directory_ + "/kvparkd.sock";
    arena_name_ = "/kvpark-notify-" + std::to_string(getpid());
    notify_fd_ = bind_unix_socket(notify_path_, SOCK_DGRAM);
    ASSERT_GE(notify_fd_, 0);
  }

  void TearDown() override {
    if (daemon_) daemon_->kill_hard();
    close(notify_fd_);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    shm_unlink(arena_name_.c_str());
    std::error_code ec;
    std::filesystem::remove_all(directory_, ec);
  }

  void start(const char* watchdog_usec, const std::string& http_listen = "off") {
    setenv("NOTIFY_SOCKET", notify_path_.c_str(), 1);
    unsetenv("WATCHDOG_PID");
    if (watchdog_usec != nullptr)
      setenv("WATCHDOG_USEC", watchdog_usec, 1);
    else
      unsetenv("WATCHDOG_USEC");
    daemon_ = std::make_unique<ChildProcess>(spawn_process(
        {built_binary("KVPARKD"), "--config", "/dev/null", "--socket", socket_path_, "--arena-name",
         arena_name_, "--arena-size", "16M", "--dbus", "off", "--http-listen", http_listen}));
    ASSERT_GT(daemon_->pid, 0);
  }

  // The next datagram within timeout_msec; empty on timeout.
  std::string receive(int timeout_msec) {
    pollfd p{notify_fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_msec) <= 0) return "";
    char buffer[4096];
    const ssize_t n = recv(notify_fd_, buffer, sizeof buffer, 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : "";
  }

  // Receives until a message containing `field` arrives; all messages seen go to ret_seen.
  bool receive_until(const std::string& field, int timeout_msec,
                     std::vector<std::string>* ret_seen) {
    const uint64_t deadline = now_msec() + timeout_msec;
    while (now_msec() < deadline) {
      const std::string m = receive(static_cast<int>(deadline - now_msec()));
      if (m.empty()) continue;
      if (ret_seen != nullptr) ret_seen->push_back(m);
      if (("\n" + m + "\n").find("\n" + field + "\n") != std::string::npos ||
          m.rfind(field, 0) == 0) {
        return true;
      }
    }
    return false;
  }

  std::string directory_;
  std::string notify_path_;
  std::string socket_path_;
  std::string arena_name_;
  int notify_fd_ = -1;
  std::unique_ptr<ChildProcess> daemon_;
};

TEST_F(NotifyTest, ReadyOnlyOnceTheEngineSocketAccepts) {
  ASSERT_FALSE(socket_accepts(socket_path_));
  start(nullptr);
  std::vector<std::string> seen;
  ASSERT_TRUE(receive_until("READY=1", 10'000, &seen));
  // The moment READY=1 is read, an engine can connect.
  EXPECT_TRUE(socket_accepts(socket_path_));
  ASSERT_FALSE(seen.empty());
  for (size_t i = 0; i + 1 < seen.size(); ++i) {
    EXPECT_EQ(seen[i].find("READY=1"), std::string::npos) << "READY=1 sent twice";
  }
  EXPECT_NE(seen.back().find("STATUS="), std::string::npos) << seen.back();
  // No watchdog configured: no pings.
  std::vector<std::string> later;
  EXPECT_FALSE(receive_until("WATCHDOG=1", 600, &later));

  ASSERT_EQ(kill(daemon_->pid, SIGTERM), 0);
  std::vector<std::string> stopping;
  EXPECT_TRUE(receive_until("STOPPING=1", 10'000, &stopping));
  EXPECT_EQ(daemon_->wait_exit(10'000), 0);
}

TEST_F(NotifyTest, ReadyStatusNamesTheHttpPortBoundForPortZero) {
  start(nullptr, "127.0.0.1:0");
  std::vector<std::string> seen;
  ASSERT_TRUE(receive_until("READY=1", 10'000, &seen));
  const std::string ready = seen.back();
  EXPECT_NE(ready.find("STATUS=serving on " + socket_path_ + ", http on 127.0.0.1:"),
            std::string::npos)
      << ready;
  const int port = http_port_in_ready_message(ready);
  ASSERT_GT(port, 0) << ready;
  // The port named is the one serving: a plain HTTP/1.0 GET gets a status line.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string request = "GET /v1/status HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  char reply[64] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10'000), 1);
  ASSERT_GT(read(fd, reply, sizeof reply - 1), 0);
  close(fd);
  EXPECT_EQ(std::string(reply).rfind("HTTP/1.1 200", 0), 0u) << reply;
  ASSERT_EQ(kill(daemon_->pid, SIGTERM), 0);
  EXPECT_EQ(daemon_->wait_exit(10'000), 0);
}

TEST_F(NotifyTest, ReadyStatusNamesNoHttpWhenItIsOff) {
  start(nullptr);
  std::vector<std::string> seen;
  ASSERT_TRUE(receive_until("READY=1", 10'000, &seen));
  EXPECT_EQ(seen.back().find("http on"), std::string::npos) << seen.back();
  EXPECT_EQ(http_port_in_ready_message(seen.back()), -1);
}

TEST_F(NotifyTest, WatchdogPingsAtAboutHalfTheInterval) {
  start("200000");  // 200 ms: a ping about every 100 ms
  ASSERT_TRUE(receive_until("READY=1", 10'000, nullptr));
  int pings = 0;
  const uint64_t deadline = now_msec() + 1000;
  while (now_msec() < deadline) {
    const std::string m = receive(static_cast<int>(deadline - now_msec()));
    if (m == "WATCHDOG=1") ++pings;
  }
  // About 10 are due; a loaded machine may delay some, never all.
  EXPECT_GE(pings, 4);
  EXPECT_LE(pings, 25);
  ASSERT_EQ(kill(daemon_->pid, SIGTERM), 0);
  EXPECT_TRUE(receive_until("STOPPING=1", 10'000, nullptr));
  EXPECT_EQ(daemon_->wait_exit(10'000), 0);
}

// The harness reads its notify socket only while it waits for READY=1: afterwards it
// is a service manager that stopped reading. With a ping every millisecond the queue
// is full at once; the daemon must keep serving, and stop cleanly.
TEST(NotifyManager, ASocketNobodyReadsNeverStallsTheLoop) {
  DaemonProcess daemon(DaemonConfig{.env = {"WATCHDOG_USEC=2000"}});
  ASSERT_TRUE(daemon.start()) << daemon.log_tail();
  ASSERT_TRUE(wait_until([&] {
    std::ifstream in(daemon.log_path());
    const std::string log{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    return log.find("the service manager is not reading notifications") != std::string::npos;
  })) << daemon.log_tail();
  // Round trips through the loop (HELLO, STATS), each after more pings found the queue full.
  for (int i = 0; i < 20; ++i) {
    StatsClient stats(daemon.socket_path());
    ASSERT_TRUE(stats.ok()) << i;
    EXPECT_GT(stats.get().connections, 0u);
    EXPECT_EQ(stats.last_status(), KVPARK_OK) << i;
  }
  EXPECT_EQ(daemon.stop(), 0) << daemon.log_tail();
}

}  // namespace
}  // namespace kvpark::testing
