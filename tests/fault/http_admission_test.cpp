// HTTP that stays up, against a real kvparkd and a real kvpark-proxy: status and
// health answer while 64 slow clients dribble request heads; oversized and chunked
// bodies are refused at the door; a request that has arrived is never the one displaced
// to make room; a head that never ends is closed at its deadline;
// a second listener on a port in use fails with "address already in use".
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "proto/limits.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/loopback_tcp.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr size_t slow_clients = 64;
constexpr int slow_byte_interval_msec = 1000;  // one header byte a second, each
constexpr int probe_interval_msec = 100;
constexpr size_t probes = 40;
// What the issue asks of status under this load: printed with what was measured, and
// never judged here (a loaded machine is slow without anything being wrong). What is
// judged is that every probe is answered within probe_deadline_sec.
constexpr double status_latency_goal_msec = 100;
constexpr int probe_deadline_sec = 10;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Reads until EOF or the deadline; what arrived.
std::string read_until_eof(int fd, int timeout_msec, bool* ret_eof = nullptr) {
  std::string out;
  const uint64_t deadline = now_msec() + timeout_msec;
  if (ret_eof != nullptr) *ret_eof = false;
  while (now_msec() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(deadline - now_msec())) <= 0) break;
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (ret_eof != nullptr) *ret_eof = true;
      break;
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Latency {
  size_t answered = 0;  // 200s
  size_t retried = 0;   // probes whose first connection was closed unanswered
  double median_msec = 0;
  double max_msec = 0;
};

// Holds `slow_clients` connections that send a request head one byte a second
// (reconnecting whenever the server drops one, as an attacker would) while GETting
// `path` every probe_interval_msec; the latencies of those GETs.
Latency latency_under_slow_clients(uint16_t port, const std::string& path,
                                   size_t clients = slow_clients) {
  std::atomic<bool> done{false};
  std::atomic<uint64_t> reconnects{0};
  std::atomic<bool> flood_sent{false};  // every client connected and sent its first byte
  std::thread dribbler([&] {
    static const std::string head = "GET " + path + " HTTP/1.1\r\nHost: slow\r\nX-Pad: " +
                                    std::string(256, 'a') + "\r\n\r\n";
    std::vector<int> fds(clients, -1);
    std::vector<size_t> sent(clients, 0);
    while (!done) {
      for (size_t i = 0; i < clients; ++i) {
        if (fds[i] < 0) {
          fds[i] = connect_loopback(port);
          sent[i] = 0;
          ++reconnects;
        }
        if (fds[i] < 0) continue;
        if (send(fds[i], head.data() + sent[i] % (head.size() - 4), 1, MSG_NOSIGNAL) != 1) {
          close(fds[i]);
          fds[i] = -1;
          continue;
        }
        ++sent[i];
      }
      flood_sent = true;
      for (int waited = 0; waited < slow_byte_interval_msec && !done; waited += 20) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the attack's pace
      }
    }
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  });
  EXPECT_TRUE(wait_until([&] { return flood_sent.load(); }));
  std::vector<double> msec;
  Latency out;
  for (size_t i = 0; i < probes; ++i) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(probe_deadline_sec, 0);
    client.set_read_timeout(probe_deadline_sec, 0);
    const auto start = std::chrono::steady_clock::now();
    httplib::Result r = client.Get(path.c_str());
    if (!r) {
      // A probe the scheduler paused between connect and send looks like one more
      // slow sender and may be displaced (that is the policy): a monitor's next
      // scrape. A starved server fails the retry too.
      ++out.retried;
      r = client.Get(path.c_str());
    }
    const double took =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // kvpark-proxy's /health is 503 while its upstream is unverified: still an answer.
    if (r && (r->status == 200 || (path == "/health" && r->status == 503))) {
      ++out.answered;
      msec.push_back(took);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(probe_interval_msec));  // probe pace
  }
  done = true;
  dribbler.join();
  std::sort(msec.begin(), msec.end());
  if (!msec.empty()) {
    out.median_msec = msec[msec.size() / 2];
    out.max_msec = msec.back();
  }
  printf("GET %s under %zu slow clients (%llu connections opened): %zu/%zu answered "
         "(%zu on a second try), median %.2f ms, max %.2f ms (goal < %.0f ms)\n",
         path.c_str(), clients, static_cast<unsigned long long>(reconnects.load()),
         out.answered, probes, out.retried, out.median_msec, out.max_msec, status_latency_goal_msec);
  return out;
}

class HttpAdmission : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
    daemon_ = std::make_unique<DaemonProcess>(
        DaemonConfig{.extra_args = {"--http-listen", "127.0.0.1:0"}});
    ASSERT_TRUE(daemon_->start()) << read_file(daemon_->log_path());
    // The port it bound, from its READY=1 status (never from the log).
    ASSERT_GT(daemon_->http_port(), 0) << read_file(daemon_->log_path());
    port_ = static_cast<uint16_t>(daemon_->http_port());
  }
  void TearDown() override {
    if (daemon_ && daemon_->running()) {
      EXPECT_EQ(daemon_->stop(), 0);
    }
  }

  std::unique_ptr<DaemonProcess> daemon_;
  uint16_t port_ = 0;
};

TEST_F(HttpAdmission, StatusAnswersWhileSixtyFourSlowClientsDribbleHeads) {
  latency_under_slow_clients(port_, "/v1/status", 0);  // the reference, same run
  const Latency l = latency_under_slow_clients(port_, "/v1/status");
  EXPECT_EQ(l.answered, probes);
}

// The per-peer cap makes room by displacing the slowest sender. A client whose whole
// request arrived in the same burst as a wave of slow ones is not it: it is read and
// answered, however the burst falls into the daemon's accept loop.
TEST_F(HttpAdmission, RequestArrivingAmidAWaveOfSlowClientsIsAnsweredNotDisplaced) {
  constexpr size_t rounds = 20;
  const std::string request = "GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  size_t answered = 0;
  std::vector<int> slow;
  for (size_t round = 0; round < rounds; ++round) {
    // The peer's slots full of slow senders, then the request, then as many again.
    int probe = -1;
    for (size_t i = 0; i < 2 * limits::http_connections_per_peer_max + 1; ++i) {
      const int fd = connect_loopback(port_);
      if (i == limits::http_connections_per_peer_max) {
        ASSERT_GE(fd, 0);
        ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), ssize_t(request.size()));
        probe = fd;
      } else if (fd >= 0) {
        (void)send(fd, "G", 1, MSG_NOSIGNAL);
        slow.push_back(fd);
      }
    }
    const std::string reply = read_until_eof(probe, 10'000);
    answered += reply.rfind("HTTP/1.1 200", 0) == 0 ? 1 : 0;
    close(probe);
    for (int fd : slow) close(fd);
    slow.clear();
  }
  EXPECT_EQ(answered, rounds);
}

TEST_F(HttpAdmission, OversizedOrChunkedBodiesAreRefusedAtOnce) {
  struct Case {
    const char* request;
    const char* status_line;
  };
  const Case cases[] = {
      {"POST /v1/status HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n",
       "HTTP/1.1 413"},
      {"POST /v1/status HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n",
       "HTTP/1.1 411"},
  };
  for (const Case& c : cases) {
    const int fd = connect_loopback(port_);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(send(fd, c.request, strlen(c.request), MSG_NOSIGNAL), ssize_t(strlen(c.request)));
    bool eof = false;
    const std::string reply = read_until_eof(fd, 10'000, &eof);
    close(fd);
    EXPECT_EQ(reply.rfind(c.status_line, 0), 0u) << c.request << "\n-> " << reply;
    EXPECT_TRUE(eof) << "the connection must close, not hold a worker";
  }
  // The largest body the read-only API accepts still reaches the routes (405).
  httplib::Client client("127.0.0.1", port_);
  const auto at_cap = client.Post("/v1/status", std::string(limits::http_status_body_bytes_max, 'x'),
                                  "text/plain");
  ASSERT_TRUE(at_cap);
  EXPECT_EQ(at_cap->status, 405);
  const auto past_cap = client.Post(
      "/v1/status", std::string(limits::http_status_body_bytes_max + 1, 'x'), "text/plain");
  ASSERT_TRUE(past_cap);
  EXPECT_EQ(past_cap->status, 413);
}

TEST_F(HttpAdmission, HeadThatNeverEndsIsClosedAtItsDeadline) {
  const int fd = connect_loopback(port_);
  ASSERT_GE(fd, 0);
  const char partial[] = "GET /v1/status HTTP/1.1\r\nHost: x\r\n";
  ASSERT_GT(send(fd, partial, sizeof partial - 1, MSG_NOSIGNAL), 0);
  bool eof = false;
  read_until_eof(fd, static_cast<int>(2 * limits::http_head_timeout_usec / 1000), &eof);
  close(fd);
  EXPECT_TRUE(eof);
}

TEST_F(HttpAdmission, SecondDaemonOnAPortInUseFailsToListen) {
  DaemonProcess second(
      DaemonConfig{.extra_args = {"--http-listen", "127.0.0.1:" + std::to_string(port_)}});
  ASSERT_TRUE(second.start()) << read_file(second.log_path());
  EXPECT_NE(read_file(second.log_path()).find("Address already in use"), std::string::npos)
      << read_file(second.log_path());
  EXPECT_EQ(second.stop(), 0);
  // Only the first one answers there.
  httplib::Client client("127.0.0.1", port_);
  const auto r = client.Get("/v1/status");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find(daemon_->socket_path()), std::string::npos);
}

TEST_F(HttpAdmission, ProxyHealthAnswersUnderSlowClientsAndItsPortIsItsOwn) {
  const std::string proxy = built_binary("KVPARK_PROXY");
  if (proxy.empty()) GTEST_SKIP() << "KVPARK_PROXY not set";
  const std::string slots = std::filesystem::path(daemon_->log_path()).parent_path() / "slots";
  const auto port = static_cast<uint16_t>(free_tcp_port());
  const std::vector<std::string> argv = {proxy, "--listen", "127.0.0.1:" + std::to_string(port),
                                         "--upstream", "a=http://127.0.0.1:1", "--slot-dir", slots,
                                         "--socket", daemon_->socket_path()};
  ChildProcess first = spawn_process(argv);
  ASSERT_TRUE(first.wait_for_line("kvpark-proxy: listening", 20'000));
  std::string output;
  std::vector<std::string> second = {"/bin/sh", "-c", ""};
  for (const std::string& a : argv) second[2] += "'" + a + "' ";
  second[2] += "2>&1";
  EXPECT_EQ(run_process(second, 20'000, &output), 1) << output;
  EXPECT_NE(output.find("Address already in use"), std::string::npos) << output;
  const Latency l = latency_under_slow_clients(port, "/health");
  EXPECT_EQ(l.answered, probes);
  kill(first.pid, SIGTERM);
  EXPECT_EQ(first.wait_exit(10'000), 0);
}

}  // namespace
}  // namespace kvpark::testing
