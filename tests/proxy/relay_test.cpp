// proxy/relay.h against an in-process upstream that sends its status and half a body,
// then closes: the relay says the body broke off, and a relayed stream breaks the
// client's stream in turn (an error event, no last chunk).
#include "proxy/relay.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

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

}  // namespace
}  // namespace kvpark::proxy
