// kvpark-proxy end to end against hostile or failing input: bodies nested deep enough
// to overflow a recursive parser, an upstream that dies mid-response or answers
// nonsense (fault_upstream.h), and a shared head that must never be parked from a
// slot holding another conversation after it.
#include <signal.h>

#include <atomic>
#include <thread>

#include "proxy/json.h"
#include "tests/proxy/fault_upstream.h"
#include "tests/proxy/proxy_e2e.h"
#include "tests/proxy/proxy_metrics.h"

namespace kvpark::testing {
namespace {

constexpr const char* chat_path = "/v1/chat/completions";
constexpr int log_wait_msec_max = 15'000;

// Chat requests the proxy counts as answered, over every reuse label.
double answered(const std::string& proxy_url) {
  const PromDocument doc = scrape(proxy_url);
  double sum = 0;
  for (const char* reuse :
       {"root", "shared_stable_prefix", "private_turn_closure", "slot", "uncached"})
    sum += metric(doc, "kvpark_proxy_requests_total", {{"reuse", reuse}});
  return sum;
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Waits until the proxy logged `n` chat requests: a request's line comes after its
// turn was parked (or not) and its slot given back.
bool wait_for_request_lines(const ProxyProcess& proxy, size_t n) {
  return wait_until(
      [&] { return count_of(proxy.log_tail(1 << 20), "POST /v1/chat/completions") >= n; },
      log_wait_msec_max);
}

// A chat request whose document nests `depth` levels: the messages one level in,
// an extra member holding the rest.
std::string nested_request(size_t depth) {
  const size_t extra = depth - 1;  // the root object is one level
  return "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"Be brief.\"}],"
         "\"kvpark_test_padding\":" +
         std::string(extra, '[') + std::string(extra, ']') + "}";
}

// The slot file kvparkd holds for the longest parked prefix of `tokens` in the
// proxy's namespace `space_hex`: its position (0: nothing parked) and size.
struct ParkedSlotFile {
  uint32_t position = 0;
  uint64_t file_bytes = 0;
};

ParkedSlotFile read_parked(const std::string& socket, const std::string& space_hex,
                           const std::vector<int32_t>& tokens) {
  ParkedSlotFile ret;
  const kvpark_namespace ns = proxy_namespace(space_hex, "reading-test");
  kvpark_client* client = nullptr;
  if (kvpark_connect(socket.c_str(), &ns, &client) != KVPARK_OK) return ret;
  kvpark_plan* plan = nullptr;
  if (kvpark_lookup(client, /*session_id=*/1, tokens.data(), tokens.size(), &plan) == KVPARK_OK) {
    const uint64_t payload_bytes = kvpark_plan_snapshot_bytes(plan, &ret.position);
    if (payload_bytes > sizeof(SealedPayloadHeader))
      ret.file_bytes = payload_bytes - sizeof(SealedPayloadHeader);
    kvpark_plan_release(plan);
  }
  kvpark_disconnect(client);
  return ret;
}

// The size of the slot file llama-server saves for `tokens` alone, prefilled into
// `slot` directly (its state grows with the tokens it holds); 0 on failure.
uint64_t slot_file_bytes_of(const std::string& server_url, const std::string& slot_dir,
                            const std::vector<int32_t>& tokens, int slot) {
  std::string prompt;
  for (int32_t t : tokens) prompt += (prompt.empty() ? "" : ",") + std::to_string(t);
  const std::string id = std::to_string(slot);
  const HttpResult prefill = http_post(
      server_url, "/completion",
      "{\"prompt\":[" + prompt + "],\"n_predict\":0,\"cache_prompt\":true,\"id_slot\":" + id + "}");
  const HttpResult save =
      http_post(server_url, "/slots/" + id + "?action=save", "{\"filename\":\"reference\"}");
  const std::string path = slot_dir + "/reference";
  struct stat st;
  const bool ok = prefill.status == 200 && save.status == 200 && stat(path.c_str(), &st) == 0;
  unlink(path.c_str());
  return ok ? uint64_t(st.st_size) : 0;
}

// Regression: a body of 200,000 "[" overflowed the worker thread's stack in
// RapidJSON's recursive parser (SIGSEGV). Refused with a 400 now, at one level past
// the limit; the limit itself is served.
TEST_F(ProxyE2E, DeeplyNestedRequestGets400AndTheProxyStaysUp) {
  start_server();
  ProxyProcess& proxy = start_proxy();
  for (const std::string& body :
       {std::string(deep_fault_levels, '['), nested_request(proxy::json_depth_max + 1)}) {
    const HttpResult r = http_post(proxy.url(), chat_path, body);
    ASSERT_EQ(r.status, 400) << body.substr(0, 200) << " -> " << r.body;
    const ErrorBody error = parse_error_body(r.body);
    EXPECT_TRUE(error.parsed) << r.body;
    EXPECT_EQ(error.code, 400) << r.body;
    EXPECT_EQ(error.type, "invalid_request_error") << r.body;
    EXPECT_NE(error.message.find("nested more than"), std::string::npos) << error.message;
  }
  const HttpResult at_limit =
      http_post(proxy.url(), chat_path, nested_request(proxy::json_depth_max));
  EXPECT_EQ(at_limit.status, 200) << at_limit.body;
  // Passed through to llama-server unread: the proxy only looks for "model" in it.
  const HttpResult other = http_post(proxy.url(), "/tokenize", std::string(deep_fault_levels, '['));
  EXPECT_NE(other.status, 0) << "the proxy died on a pass-through body";
  const ChatResult good = post_chat(proxy.url(), chat(conversation("Be brief.", user_text(300))));
  EXPECT_EQ(good.http.status, 200) << describe(good);
}

// Regression: a deeply nested upstream reply (a chat completion, a usage event, a
// rendered template, an error body, GET /slots) crashed the proxy the same way.
TEST_F(ProxyE2E, DeeplyNestedUpstreamRepliesDoNotCrashTheProxy) {
  LlamaServerProcess& server = start_server();
  FaultUpstream upstream(server.url());
  ASSERT_TRUE(upstream.start());
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = upstream.url()}});
  struct Case {
    const char* path;
    UpstreamFault fault;
    bool stream;
    uint64_t seed;  // a new head: the proxy prefills it (POST /completion)
  };
  int delivered = 0;
  for (const Case& c : {Case{chat_path, UpstreamFault::deep_ok, false, 301},
                        Case{chat_path, UpstreamFault::deep_ok, true, 302},
                        Case{"/apply-template", UpstreamFault::deep_ok, false, 303},
                        Case{"/completion", UpstreamFault::deep_error, false, 304}}) {
    upstream.arm(c.path, c.fault);
    // Not post_chat(): this test's client would parse the deep reply recursively.
    const ChatRequest request = chat(conversation(head_text(c.seed), user_text(c.seed)), c.stream);
    const HttpResult r = http_post(proxy.url(), chat_path, chat_request_json(request));
    EXPECT_EQ(upstream.delivered(), ++delivered) << c.path << ": the fault never reached the proxy";
    EXPECT_NE(r.status, 0) << c.path << " stream " << c.stream << ": no answer";
    if (http_get(proxy.url(), "/health").status == 0) {
      ADD_FAILURE() << c.path << " stream " << c.stream << ": the proxy died";
      proxy.kill_hard();                               // reaps it
      ASSERT_TRUE(proxy.start()) << proxy.log_tail();  // so each case is tried
    }
  }
  // GET /slots: the proxy's watcher asks every few seconds.
  upstream.arm("/slots", UpstreamFault::deep_ok);
  EXPECT_TRUE(wait_until([&] { return upstream.delivered() > delivered; }, log_wait_msec_max));
  EXPECT_TRUE(
      wait_until([&] { return http_get(proxy.url(), "/health").status == 200; }, log_wait_msec_max))
      << "after GET /slots: " << proxy.log_tail();
  const ChatResult good = post_chat(proxy.url(), chat(conversation("Be brief.", user_text(305))));
  EXPECT_EQ(good.http.status, 200) << describe(good);
}

// Regression: an upstream that died after its status line was answered 200 with
// half a body, and the turn was parked and counted answered.
TEST_F(ProxyE2E, UpstreamDyingMidReplyGets502AndNothingIsParked) {
  LlamaServerProcess& server = start_server();
  FaultUpstream upstream(server.url());
  ASSERT_TRUE(upstream.start());
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = upstream.url()}});
  const std::string system = head_text(32);

  upstream.arm(chat_path, UpstreamFault::truncate);
  const ChatResult cut = post_chat(proxy.url(), chat(conversation(system, user_text(320))));
  ASSERT_EQ(upstream.delivered(), 1);
  EXPECT_EQ(cut.http.status, 502) << describe(cut);
  const ErrorBody error = parse_error_body(cut.http.body);
  EXPECT_TRUE(error.parsed) << cut.http.body;
  EXPECT_EQ(error.code, 502) << cut.http.body;
  EXPECT_NE(error.message.find(upstream.url()), std::string::npos) << error.message;
  ASSERT_TRUE(wait_for_request_lines(proxy, 1)) << proxy.log_tail();
  // The head the request led was parked before it was forwarded; its turn is not.
  EXPECT_EQ(wait_for_publishes(proxy, 1).publishes, 1);
  EXPECT_EQ(answered(proxy.url()), 0);

  const ChatResult next = post_chat(proxy.url(), chat(conversation(system, user_text(321))));
  EXPECT_EQ(next.http.status, 200) << describe(next);
  ASSERT_TRUE(wait_for_request_lines(proxy, 2)) << proxy.log_tail();
  EXPECT_EQ(answered(proxy.url()), 1);
}

// Regression: an upstream that died mid-stream ended the client's stream cleanly
// (no [DONE], but nothing to tell it from a finished one), and the turn was parked
// and counted answered. The stream now breaks: an error event, no last chunk.
TEST_F(ProxyE2E, UpstreamDyingMidStreamBreaksTheClientsStream) {
  LlamaServerProcess& server = start_server();
  FaultUpstream upstream(server.url());
  ASSERT_TRUE(upstream.start());
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = upstream.url()}});
  const std::string system = head_text(33);

  upstream.arm(chat_path, UpstreamFault::truncate);
  ChatRequest request = chat(conversation(system, user_text(330)), /*stream=*/true);
  request.max_tokens = 32;  // events enough that half of them is several
  const ChatResult cut = post_chat(proxy.url(), request);
  ASSERT_EQ(upstream.delivered(), 1);
  EXPECT_EQ(cut.http.status, 0) << "the stream must end in a transfer error: " << describe(cut);
  EXPECT_EQ(cut.http.body.find("[DONE]"), std::string::npos) << cut.http.body;
  EXPECT_NE(cut.http.body.find("data: {\"error\":"), std::string::npos) << cut.http.body;
  ASSERT_TRUE(wait_for_request_lines(proxy, 1)) << proxy.log_tail();
  EXPECT_EQ(wait_for_publishes(proxy, 1).publishes, 1);
  EXPECT_EQ(answered(proxy.url()), 0);

  const ChatResult next =
      post_chat(proxy.url(), chat(conversation(system, user_text(331)), /*stream=*/true));
  EXPECT_EQ(next.http.status, 200) << describe(next);
  EXPECT_NE(next.http.body.find("[DONE]"), std::string::npos) << next.http.body;
  ASSERT_TRUE(wait_for_request_lines(proxy, 2)) << proxy.log_tail();
  EXPECT_EQ(answered(proxy.url()), 1);
}

// A client that hangs up while its answer, not streamed, is still being generated
// (llama-server sends nothing of such a reply until it is whole) no longer keeps the
// generation going: the proxy abandons the upstream request (its connection closes,
// and llama-server cancels the task), gives the slot back, logs the request as 499 and
// counts it abandoned, not answered. Before, the slot stayed taken, and the upstream
// busy, until the answer was whole for a client long gone.
TEST_F(ProxyE2E, AClientHangingUpOnAnAnswerNotStreamedAbandonsItsUpstreamRequest) {
  LlamaServerProcess& server = start_server();
  FaultUpstream upstream(server.url());
  ASSERT_TRUE(upstream.start());
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = upstream.url()}});
  const std::string system = head_text(34);

  upstream.arm(chat_path, UpstreamFault::hold);
  httplib::Client client(proxy.url());
  client.set_read_timeout(2 * hold_timeout_sec, 0);
  std::thread caller([&] {
    (void)client.Post(chat_path, chat_request_json(chat(conversation(system, user_text(340)))),
                      "application/json");
  });
  const bool held = wait_until([&] { return upstream.delivered() == 1; }, log_wait_msec_max);
  client.stop();  // hangs up
  caller.join();
  ASSERT_TRUE(held) << proxy.log_tail();
  ProxyStatus status;
  const bool abandoned = wait_until(
      [&] {
        status = get_proxy_status(proxy.url());
        return status.abandoned == 1 && status.upstreams.size() == 1 &&
               status.upstreams[0].busy_slots == 0;
      },
      log_wait_msec_max);
  EXPECT_TRUE(abandoned) << "the upstream request is still waited on: " << status.body;
  ASSERT_TRUE(wait_for_request_lines(proxy, 1)) << proxy.log_tail();
  EXPECT_NE(proxy.log_tail().find("status=499"), std::string::npos) << proxy.log_tail();
  EXPECT_EQ(answered(proxy.url()), 0);
  EXPECT_EQ(metric(scrape(proxy.url()), "kvpark_proxy_abandoned_requests_total"), 1);

  const ChatResult next = post_chat(proxy.url(), chat(conversation(system, user_text(341))));
  EXPECT_EQ(next.http.status, 200) << describe(next);
  ASSERT_TRUE(wait_for_request_lines(proxy, 2)) << proxy.log_tail();
  EXPECT_EQ(answered(proxy.url()), 1);
  EXPECT_EQ(get_proxy_status(proxy.url()).abandoned, 1);

  // The same for an endpoint passed through as is.
  upstream.arm("/v1/completions", UpstreamFault::hold);
  httplib::Client other(proxy.url());
  other.set_read_timeout(2 * hold_timeout_sec, 0);
  std::thread passed([&] {
    (void)other.Post("/v1/completions", R"({"prompt": "the park", "max_tokens": 8})",
                     "application/json");
  });
  const bool held_again = wait_until([&] { return upstream.delivered() == 2; }, log_wait_msec_max);
  other.stop();
  passed.join();
  ASSERT_TRUE(held_again) << proxy.log_tail();
  EXPECT_TRUE(
      wait_until([&] { return get_proxy_status(proxy.url()).abandoned == 2; }, log_wait_msec_max))
      << get_proxy_status(proxy.url()).body;
}

// Regression: sibling A's conversation stays in its slot (kvparkd was away, so no
// head was parked); sibling B leads the head's flight, lands in that slot because it
// holds the head, and parked the slot, A's turn after the head included, as the
// shared head. The head is parked alone now, and restores as such.
TEST_F(ProxyE2E, SharedHeadIsParkedAloneFromASlotHoldingAnotherConversation) {
  LlamaServerProcess& server = start_server();
  // Whole slot files: what is parked is the file llama-server saved, to compare.
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: ready", {"--park-as", "whole"});
  const std::string system = head_text(34);
  std::vector<int32_t> rendered;
  const std::vector<int32_t> head = head_of(server.url(), system, &rendered);
  ASSERT_GT(head.size(), 1000u);
  const std::string space = get_proxy_status(proxy.url()).upstreams.at(0).space;
  ASSERT_EQ(space.size(), 32u);
  // Before the proxy uses any slot but the one it checked slot files with.
  const uint64_t head_file_bytes = slot_file_bytes_of(server.url(), slot_dir_, head, 3);
  ASSERT_GT(head_file_bytes, 0u);

  daemon_.stop();
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(340))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  ASSERT_TRUE(daemon_.start());
  ASSERT_TRUE(wait_until([&] { return get_proxy_status(proxy.url()).kvparkd_connected; },
                         reconnect_wait_msec_max));

  const ChatResult b = post_chat(proxy.url(), chat(conversation(system, user_text(341))));
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_EQ(b.http.header("x-kvpark-slot"), a.http.header("x-kvpark-slot")) << describe(b);
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  ASSERT_TRUE(
      wait_until([&] { return read_parked(daemon_.socket_path(), space, rendered).position > 0; },
                 publish_wait_msec_max));
  const ParkedSlotFile parked = read_parked(daemon_.socket_path(), space, rendered);
  EXPECT_EQ(parked.position, head.size());
  EXPECT_EQ(parked.file_bytes, head_file_bytes) << "parked as the head, the slot file holds more";

  // Nothing in any slot now: the next sibling restores the head, and only the head.
  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest sibling = chat(conversation(system, user_text(342)));
  const ChatResult c = post_chat(proxy.url(), sibling);
  ASSERT_EQ(c.http.status, 200) << describe(c);
  EXPECT_EQ(c.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(c);
  EXPECT_EQ(c.header_int("x-kvpark-restored-tokens"), int64_t(head.size())) << describe(c);
  EXPECT_EQ(c.cache_n, int64_t(head.size())) << "llama-server's cache after the restore";
  const ChatResult direct = post_chat(server.url(), reference(sibling));
  EXPECT_EQ(c.content, direct.content);
}

// Regression: with kvparkd stopped (SIGSTOP: there, but silent), every request waited
// 30 s for its reply, one after another behind the proxy's lock, so four requests took
// minutes. Now the first waits out a short reply timeout and the rest go straight
// to llama-server, uncached; once kvparkd answers again, the proxy parks again.
TEST_F(ProxyE2E, RequestsAreServedUncachedWhileKvparkdIsStoppedNotQueuedBehindIt) {
  constexpr int requests = 4;
  // Minutes before; seconds now. Far from either on a loaded machine.
  constexpr int served_wait_msec_max = 60'000;
  start_server();
  ProxyProcess& proxy = start_proxy();
  const ChatResult first =
      post_chat(proxy.url(), chat(conversation(head_text(36), user_text(360))));
  ASSERT_EQ(first.http.status, 200) << describe(first);
  const int64_t publishes = wait_for_publishes(proxy, 2).publishes;

  ASSERT_EQ(kill(daemon_.pid(), SIGSTOP), 0);
  struct Resume {  // whatever fails below, kvparkd is not left stopped
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{daemon_.pid()};
  std::vector<ChatResult> results(requests);
  std::atomic<int> served{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < requests; ++i)
    clients.emplace_back([&, i] {
      results[size_t(i)] =
          post_chat(proxy.url(), chat(conversation(head_text(37 + uint64_t(i)), user_text(370))));
      ++served;
    });
  const bool served_while_stopped =
      wait_until([&] { return served.load() == requests; }, served_wait_msec_max);
  const ProxyStatus stopped = get_proxy_status(proxy.url());
  ASSERT_EQ(kill(daemon_.pid(), SIGCONT), 0);
  for (std::thread& t : clients) t.join();
  EXPECT_TRUE(served_while_stopped) << served.load() << " of " << requests << " served";
  for (int i = 0; i < requests; ++i) {
    const ChatResult& r = results[size_t(i)];
    EXPECT_EQ(r.http.status, 200) << describe(r);
    const ChatResult direct =
        post_chat(servers_.at(0)->url(),
                  reference(chat(conversation(head_text(37 + uint64_t(i)), user_text(370)))));
    EXPECT_EQ(r.content, direct.content);
  }
  ASSERT_TRUE(stopped.parsed) << stopped.body;
  EXPECT_FALSE(stopped.kvparkd_connected) << stopped.body;
  EXPECT_GE(stopped.uncached_requests, requests) << stopped.body;

  // kvparkd answers again: the proxy connects and parks the next conversation.
  ASSERT_TRUE(wait_until([&] { return get_proxy_status(proxy.url()).kvparkd_connected; },
                         reconnect_wait_msec_max));
  const ChatResult later =
      post_chat(proxy.url(), chat(conversation(head_text(41), user_text(371))));
  ASSERT_EQ(later.http.status, 200) << describe(later);
  EXPECT_GT(wait_for_publishes(proxy, publishes + 1).publishes, publishes);
}

}  // namespace
}  // namespace kvpark::testing
