// proxy/relay.h against an in-process upstream that sends its status and half a body,
// then closes: the relay says the body broke off, and a relayed stream breaks the
// client's stream in turn (an error event, no last chunk).
#include "proxy/relay.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "tests/testing/loopback_tcp.h"
#include "tests/testing/wait.h"

namespace kvpark::proxy {
namespace {

constexpr const char* whole_json = "{\"choices\":[{\"message\":{\"content\":\"a whole answer\"}}]}";
constexpr const char* whole_events = "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n";

// An HTTP server on a free 127.0.0.1 port, served from a thread of its own.
class TestServer {
 public:
  ~TestServer() {
    server.stop();
    if (thread_.joinable()) thread_.join();
  }
  std::string start() {
    const int port = server.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server.listen_after_bind(); });
    return "http://127.0.0.1:" + std::to_string(port);
  }
  httplib::Server server;

 private:
  std::thread thread_;
};

// /whole answers whole_json; /half its first half under the whole Content-Length;
// /events whole_events chunked; /half-events their first half, then no last chunk.
void serve_origin(httplib::Server& server) {
  server.Post("/whole", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(whole_json, "application/json");
  });
  server.Post("/half", [](const httplib::Request&, httplib::Response& res) {
    const std::string body = whole_json;
    res.set_content_provider(body.size(), "application/json",
                             [body](size_t offset, size_t, httplib::DataSink& sink) {
                               if (offset > 0) return false;
                               return sink.write(body.data(), body.size() / 2);
                             });
  });
  for (const char* path : {"/events", "/half-events"}) {
    const bool half = std::string(path) == "/half-events";
    server.Post(path, [half](const httplib::Request&, httplib::Response& res) {
      res.set_chunked_content_provider(
          "text/event-stream", [half](size_t offset, httplib::DataSink& sink) {
            const std::string events = whole_events;
            if (offset > 0) return false;
            sink.write(events.data(), half ? events.size() / 2 : events.size());
            if (!half) sink.done();
            return true;
          });
    });
  }
}

Upstream upstream_at(const std::string& url) {
  return Upstream(UpstreamOptions{.name = "m", .url = url, .settings = ""});
}

TEST(Relay, ABodyCutShortIsNotComplete) {
  TestServer origin;
  serve_origin(origin.server);
  const Upstream upstream = upstream_at(origin.start());
  for (const char* path : {"/whole", "/events"}) {
    Relay relay(upstream, path, "{}");
    std::string type;
    EXPECT_EQ(relay.wait_status(&type), 200) << path;
    relay.wait_body();
    EXPECT_TRUE(relay.body_complete()) << path;
  }
  for (const char* path : {"/half", "/half-events"}) {
    Relay relay(upstream, path, "{}");
    std::string type;
    EXPECT_EQ(relay.wait_status(&type), 200) << path;
    const std::string body = relay.wait_body();
    EXPECT_FALSE(relay.body_complete()) << path << ": " << body;
    EXPECT_NE(relay.failure().find("broke off mid-response"), std::string::npos) << relay.failure();
  }
}

// A front relaying /events or /half-events as stream_to_client does for a chat.
TEST(StreamToClient, AnUpstreamBreakingOffBreaksTheClientsStream) {
  TestServer origin;
  serve_origin(origin.server);
  const Upstream upstream = upstream_at(origin.start());
  std::atomic<int> ends[3] = {};  // by StreamEnd
  TestServer front;
  front.server.Post(".*", [&](const httplib::Request& req, httplib::Response& res) {
    auto relay = std::make_shared<Relay>(upstream, req.path, req.body);
    std::string type;
    relay->wait_status(&type);
    auto splitter = std::make_shared<EventSplitter>([](std::string event) { return event; });
    stream_to_client(
        relay, res, type,
        [splitter](const std::string& chunk, bool last) {
          return last ? splitter->flush() : splitter->feed(chunk);
        },
        [&](StreamEnd end) { ++ends[int(end)]; });
  });
  httplib::Client client(front.start());

  httplib::Result whole = client.Post("/events", "{}", "application/json");
  ASSERT_TRUE(whole) << httplib::to_string(whole.error());
  EXPECT_EQ(whole->body, whole_events);

  std::string received;
  httplib::Request request;
  request.method = "POST";
  request.path = "/half-events";
  request.body = "{}";
  request.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    received.append(data, n);
    return true;
  };
  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  EXPECT_FALSE(client.send(request, response, error)) << "the stream ended cleanly: " << received;
  EXPECT_EQ(received.find("data: {\"n\":1}\n\n"), 0u) << received;  // whole events only
  EXPECT_EQ(received.find("[DONE]"), std::string::npos) << received;
  EXPECT_NE(received.find("\n\ndata: {\"error\":{\"message\":\""), std::string::npos) << received;
  EXPECT_NE(received.find("\"code\":502"), std::string::npos) << received;

  // on_end runs once the front is done with the response, maybe after the client.
  EXPECT_TRUE(testing::wait_until([&] { return ends[int(StreamEnd::upstream_failed)] == 1; }));
  EXPECT_EQ(ends[int(StreamEnd::completed)].load(), 1);
  EXPECT_EQ(ends[int(StreamEnd::upstream_failed)].load(), 1);
  EXPECT_EQ(ends[int(StreamEnd::client_gone)].load(), 0);
}

// An upstream that reads a request and then says nothing, as llama-server does while
// it generates a reply that is not streamed: it only watches for its connection to
// close (or silent_origin_watch_msec to pass). One connection at a time.
constexpr int silent_origin_watch_msec = 60'000;

class SilentOrigin {
 public:
  SilentOrigin() {
    listen_fd_ = testing::listen_loopback(port_);
    if (listen_fd_ < 0) {
      ADD_FAILURE() << "cannot listen on 127.0.0.1";
      return;
    }
    thread_ = std::thread([this] { serve(); });
  }
  ~SilentOrigin() {
    stopping_ = true;
    shutdown(listen_fd_, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    close(listen_fd_);
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int requests() const { return requests_.load(); }  // whole request heads read
  int closed() const { return closed_.load(); }      // connections its client closed

 private:
  void serve() {
    while (!stopping_) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      std::string head;
      char buf[4096];
      bool closed = false;
      const testing::Deadline deadline(silent_origin_watch_msec);
      while (!deadline.passed()) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, std::min(deadline.left_msec(), 100)) <= 0) continue;
        const ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        head.append(buf, size_t(n));
        if (head.find("\r\n\r\n") != std::string::npos && requests_counted_ < 1) {
          requests_counted_ = 1;
          ++requests_;
        }
      }
      requests_counted_ = 0;
      if (closed) ++closed_;
      close(fd);
    }
  }

  int listen_fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
  std::atomic<int> closed_{0};
  int requests_counted_ = 0;  // serve()'s own
  std::thread thread_;
};

// A client gone while the upstream is silent: the wait ends, and the upstream sees
// its connection closed (llama-server cancels a generation so), long before its
// answer would have come.
TEST(Relay, AClientGoneWhileTheUpstreamIsSilentAbandonsTheExchange) {
  SilentOrigin origin;
  const Upstream upstream = upstream_at(origin.url());
  for (const bool whole : {false, true}) {
    const int closed = origin.closed();
    Relay relay(upstream, "/v1/chat/completions", "{}");
    std::atomic<int> asked{0};
    // Gone once the origin has the request: the relay must not have an answer by then.
    const auto gone = [&] {
      ++asked;
      return origin.requests() > closed;
    };
    const bool answered = whole ? relay.wait_end_unless(gone) : relay.wait_status_unless(gone);
    EXPECT_FALSE(answered) << (whole ? "end" : "status");
    EXPECT_GT(asked.load(), 0);
    EXPECT_TRUE(testing::wait_until([&] { return origin.closed() == closed + 1; }))
        << "the upstream's connection is still open";
    EXPECT_FALSE(relay.body_complete());
  }
}

// A client that stays: the waits end with the answer, and say so.
TEST(Relay, AClientThatStaysGetsTheAnswer) {
  TestServer origin;
  serve_origin(origin.server);
  const Upstream upstream = upstream_at(origin.start());
  Relay relay(upstream, "/whole", "{}");
  int asked = 0;
  const auto gone = [&] {
    ++asked;
    return false;
  };
  EXPECT_TRUE(relay.wait_status_unless(gone));
  EXPECT_TRUE(relay.wait_end_unless(gone));
  EXPECT_EQ(relay.wait_body(), whole_json);
  EXPECT_TRUE(relay.body_complete());
}

// A relay given up at any point of its exchange, even before it connects, ends at
// once (its destructor joins the upstream request): never a wait for an answer.
TEST(Relay, AbandonedAtAnyPointItEndsWithoutTheAnswer) {
  SilentOrigin origin;
  const Upstream upstream = upstream_at(origin.url());
  constexpr int relays = 50;
  for (int i = 0; i < relays; ++i) {
    Relay relay(upstream, "/v1/chat/completions", "{}");
    if (i % 2 == 1) (void)testing::wait_until([&] { return origin.requests() > i / 2; });
    relay.abandon();
    EXPECT_FALSE(relay.body_complete()) << i;
  }
}

}  // namespace
}  // namespace kvpark::proxy
