// http/listener.h's client_hung_up, asked by handlers that a real Listener serves
// over real TCP connections: a client that closes its connection, or shuts down its
// sending side, is gone; one that waits for its answer, or sends its next request's
// bytes meanwhile, is not.
#include "http/listener.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "tests/testing/loopback_tcp.h"
#include "tests/testing/wait.h"

namespace kvpark::http {
namespace {

// How long the /watch handler watches its client before it gives up (a broken
// client_hung_up): the test fails then, it never hangs.
constexpr int watch_deadline_msec = 30'000;
constexpr int handler_poll_msec = 5;

class ClientHungUp : public ::testing::Test {
 protected:
  void SetUp() override {
    // Watches until the client is gone (or the deadline passes), then answers.
    routes_.Post("/watch", [this](const httplib::Request&, httplib::Response& res) {
      ++started_;
      const testing::Deadline deadline(watch_deadline_msec);
      bool gone = false;
      while (!(gone = client_hung_up()) && !deadline.passed()) {
        poll(nullptr, 0, handler_poll_msec);  // a handler's own pace, not the test's
      }
      watched_gone_ = gone;
      ++finished_;
      res.set_content(gone ? "gone" : "here", "text/plain");
    });
    // Asks once, when the test says so, and answers what it saw.
    routes_.Post("/ask", [this](const httplib::Request&, httplib::Response& res) {
      ++started_;
      (void)testing::wait_until([this] { return ask_now_.load(); }, watch_deadline_msec);
      res.set_content(client_hung_up() ? "gone" : "here", "text/plain");
    });
    routes_.Get("/next", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("next", "text/plain");
    });
    listener_ = std::make_unique<Listener>(routes_, ListenerOptions{.host = "127.0.0.1"});
    std::string error;
    ASSERT_TRUE(listener_->bind(error)) << error;
    listener_->start();
  }
  void TearDown() override { listener_->stop(); }

  int connect_client() {
    const int fd = testing::connect_loopback(listener_->port());
    EXPECT_GE(fd, 0);
    return fd;
  }
  static void send_all(int fd, const std::string& text) {
    ASSERT_EQ(send(fd, text.data(), text.size(), MSG_NOSIGNAL), ssize_t(text.size()));
  }
  // Reads until `want` has arrived, or EOF, or the deadline.
  static std::string read_until(int fd, const std::string& want) {
    std::string out;
    const testing::Deadline deadline(watch_deadline_msec);
    while (out.find(want) == std::string::npos && !deadline.passed()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, deadline.left_msec()) <= 0) break;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, size_t(n));
    }
    return out;
  }

  static constexpr const char* watch_request =
      "POST /watch HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}";
  static constexpr const char* ask_request =
      "POST /ask HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}";

  RouteServer routes_;
  std::unique_ptr<Listener> listener_;
  std::atomic<int> started_{0};
  std::atomic<int> finished_{0};
  std::atomic<bool> watched_gone_{false};
  std::atomic<bool> ask_now_{false};
};

TEST_F(ClientHungUp, AClientThatClosesItsConnectionIsGone) {
  const int fd = connect_client();
  send_all(fd, watch_request);
  ASSERT_TRUE(testing::wait_until([&] { return started_ == 1; }));
  close(fd);
  ASSERT_TRUE(testing::wait_until([&] { return finished_ == 1; }, watch_deadline_msec * 2));
  EXPECT_TRUE(watched_gone_.load());
}

TEST_F(ClientHungUp, AClientThatShutsDownItsSendingSideIsGone) {
  const int fd = connect_client();
  send_all(fd, watch_request);
  ASSERT_TRUE(testing::wait_until([&] { return started_ == 1; }));
  shutdown(fd, SHUT_WR);
  ASSERT_TRUE(testing::wait_until([&] { return finished_ == 1; }, watch_deadline_msec * 2));
  EXPECT_TRUE(watched_gone_.load());
  close(fd);
}

TEST_F(ClientHungUp, AClientWaitingForItsAnswerIsHere) {
  const int fd = connect_client();
  send_all(fd, ask_request);
  ASSERT_TRUE(testing::wait_until([&] { return started_ == 1; }));
  ask_now_ = true;
  const std::string answer = read_until(fd, "here");
  EXPECT_NE(answer.find("\r\n\r\nhere"), std::string::npos) << answer;
  close(fd);
}

// Bytes waiting on the connection are a next request, not a hang-up; and that
// request is served after the first on the same connection.
TEST_F(ClientHungUp, AClientSendingItsNextRequestMeanwhileIsHere) {
  const int fd = connect_client();
  send_all(fd, ask_request);
  ASSERT_TRUE(testing::wait_until([&] { return started_ == 1; }));
  send_all(fd, "GET /next HTTP/1.1\r\nHost: t\r\n\r\n");
  ask_now_ = true;
  const std::string answers = read_until(fd, "next");
  EXPECT_NE(answers.find("\r\n\r\nhere"), std::string::npos) << answers;
  EXPECT_NE(answers.find("\r\n\r\nnext"), std::string::npos) << answers;
  close(fd);
}

TEST(ClientHungUpOutsideARequest, IsFalse) {
  EXPECT_FALSE(client_hung_up());
}

}  // namespace
}  // namespace kvpark::http
