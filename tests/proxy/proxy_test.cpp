// kvpark-proxy end to end: caching, restarts, failures and answers (proxy_e2e.h has
// the fixture and what the tests rely on).
#include "tests/proxy/proxy_e2e.h"

namespace kvpark::testing {
namespace {

TEST_F(ProxyE2E, SiblingIsServedFromTheSharedHeadWithoutMarkers) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(1);
  const int64_t head_tokens = count_tokens(server.url(), system);
  ASSERT_GT(head_tokens, 1000);

  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(1))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  EXPECT_EQ(a.cached_tokens, expected_cached_tokens(a)) << describe(a);
  // A's prefill (the head, over 1000 tokens, led by A) showed llama-server's rate:
  // declared to kvparkd after the response, for its value model.
  EXPECT_TRUE(wait_until([&] { return kvparkd_proxy_prefill_rate() > 0; }, 10'000))
      << "kvparkd's namespace for the proxy says prefill rate " << kvparkd_proxy_prefill_rate();

  const int64_t before = prompt_tokens_total(server.url());
  const ChatResult b = post_chat(proxy.url(), chat(conversation(system, user_text(2))));
  const int64_t prefilled = prompt_tokens_total(server.url()) - before;
  ASSERT_EQ(b.http.status, 200) << describe(b);
  ASSERT_TRUE(b.parsed) << describe(b);
  const int64_t b_delta_max = b.prompt_tokens - head_tokens + token_slack;
  EXPECT_GT(b.prompt_n, 0) << describe(b);
  EXPECT_LE(b.prompt_n, b_delta_max) << describe(b);
  EXPECT_LE(prefilled, b_delta_max) << "llama-server prompt_tokens_total delta over B";
  const std::string reuse = b.http.header("x-kvpark-reuse");
  EXPECT_TRUE(reuse == "shared_stable_prefix" || reuse == "slot") << describe(b);
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  EXPECT_NE(b.http.header("x-kvpark-slot"), "") << describe(b);
  EXPECT_GE(b.header_int("x-kvpark-restored-tokens"), 0) << describe(b);
}

TEST_F(ProxyE2E, SixParallelRequestsPrefillTheHeadOnce) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(2);
  const int64_t head_tokens = count_tokens(server.url(), system);
  ASSERT_GT(head_tokens, 1000);

  const int64_t before = prompt_tokens_total(server.url());
  const std::vector<ChatResult> results = post_siblings_at_once(proxy.url(), system, 20);
  const int64_t prefilled = prompt_tokens_total(server.url()) - before;

  int64_t prefilled_max = head_tokens + token_slack;  // the head once
  for (const ChatResult& r : results) {
    ASSERT_EQ(r.http.status, 200) << describe(r);
    EXPECT_EQ(r.cached_tokens, expected_cached_tokens(r)) << describe(r);
    prefilled_max += r.prompt_tokens - head_tokens + token_slack;  // each one's own delta
  }
  EXPECT_GE(prefilled, head_tokens) << "the head was never prefilled?";
  EXPECT_LE(prefilled, prefilled_max) << "head tokens " << head_tokens;
  const ProxyStatus status = get_proxy_status(proxy.url());
  ASSERT_TRUE(status.parsed) << status.body;
  EXPECT_EQ(status.head_prefills, 1) << status.body;
  // No content check here: llama-server decoding several slots in one batch is not
  // bit-identical to decoding one alone (six concurrent direct requests differ from
  // their sequential answers too), so answers are compared on sequential requests.
}

// Two proxies, each in front of its own llama-server of one model (one namespace):
// six requests at once, three through each, over one new head. The head is
// prefilled once in all: the leading proxy reserves it in kvparkd before its
// prefill, and the other proxy's requests wait for it there.
TEST_F(ProxyE2E, TwoProxiesPrefillASharedHeadOnce) {
  LlamaServerProcess& server_a = start_server();
  LlamaServerProcess& server_b = start_server();
  ProxyProcess& proxy_a = start_proxy({{.name = "m", .url = server_a.url()}});
  ProxyProcess& proxy_b = start_proxy({{.name = "m", .url = server_b.url()}});
  ASSERT_EQ(get_proxy_status(proxy_a.url()).upstreams.at(0).space,
            get_proxy_status(proxy_b.url()).upstreams.at(0).space);
  // A first conversation through each, so each proxy has seen slot files of two
  // lengths (A: the head and the turn it saved; B: the head it restored and its
  // turn) and can size a head's slot file before prefilling it.
  for (ProxyProcess* proxy : {&proxy_a, &proxy_b}) {
    const ChatResult r = post_chat(proxy->url(), chat(conversation(head_text(12), user_text(160))));
    ASSERT_EQ(r.http.status, 200) << describe(r);
    wait_for_publishes(*proxy, proxy == &proxy_a ? 2 : 1);
  }

  const std::string system = head_text(13);
  const int64_t head_tokens = count_tokens(server_a.url(), system);
  const int64_t before = prompt_tokens_total(server_a.url()) + prompt_tokens_total(server_b.url());
  const int64_t prefills_before = get_proxy_status(proxy_a.url()).head_prefills +
                                  get_proxy_status(proxy_b.url()).head_prefills;
  std::vector<ChatResult> results(fan_out_requests);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < fan_out_requests; ++i) {
    const std::string url = (i % 2 == 0 ? proxy_a : proxy_b).url();
    clients.emplace_back([&, i, url] {
      results[i] = post_chat(url, chat(conversation(system, user_text(170 + i))));
    });
  }
  for (std::thread& t : clients) t.join();
  const int64_t prefilled =
      prompt_tokens_total(server_a.url()) + prompt_tokens_total(server_b.url()) - before;
  int64_t prefilled_max = head_tokens + token_slack;
  for (const ChatResult& r : results) {
    ASSERT_EQ(r.http.status, 200) << describe(r);
    prefilled_max += r.prompt_tokens - head_tokens + token_slack;
  }
  EXPECT_LE(prefilled, prefilled_max) << "head tokens " << head_tokens;
  EXPECT_EQ(get_proxy_status(proxy_a.url()).head_prefills +
                get_proxy_status(proxy_b.url()).head_prefills - prefills_before,
            1);
}

TEST_F(ProxyE2E, SiblingAfterLlamaServerRestartRestoresTheSharedHead) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(8);
  const int64_t head_tokens = count_tokens(server.url(), system);
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(30))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);

  server.stop();  // a new process: nothing of A is in any slot
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest sibling = chat(conversation(system, user_text(31)), /*stream=*/true);
  const int64_t before = prompt_tokens_total(server.url());
  const ChatResult b = post_chat(proxy.url(), sibling);
  const int64_t prefilled = prompt_tokens_total(server.url()) - before;
  ASSERT_EQ(b.http.status, 200) << describe(b);
  const int64_t b_delta_max = b.prompt_tokens - head_tokens + token_slack;
  EXPECT_EQ(b.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(b);
  EXPECT_GE(b.header_int("x-kvpark-restored-tokens"), head_tokens) << describe(b);
  EXPECT_LE(b.prompt_n, b_delta_max) << describe(b);
  EXPECT_LE(prefilled, b_delta_max) << "llama-server prompt_tokens_total delta over B";
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  const ChatResult direct = post_chat(server.url(), reference(sibling));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(b.content, direct.content);
  EXPECT_EQ(b.finish_reason, direct.finish_reason);
}

TEST_F(ProxyE2E, SecondTurnIsRestoredAfterLlamaServerRestart) {
  start_server();
  start_proxy();
  expect_second_turn_restored(3, [&] {
    LlamaServerProcess& server = *servers_.at(0);
    server.stop();
    ASSERT_TRUE(server.start()) << server.log_tail();  // same port and slot directory
  });
}

TEST_F(ProxyE2E, SecondTurnIsRestoredAfterProxyRestart) {
  start_server();
  start_proxy();
  expect_second_turn_restored(4, [&] {
    ProxyProcess& proxy = *proxies_.at(0);
    EXPECT_EQ(proxy.stop(), 0) << "SIGTERM must exit 0";
    ASSERT_TRUE(proxy.start()) << proxy.log_tail();  // same port
  });
}

TEST_F(ProxyE2E, RequestsSucceedUncachedWhenKvparkdIsDown) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(5);
  const ChatRequest first = chat(conversation(system, user_text(50)));
  const ChatResult cached = post_chat(proxy.url(), first);
  ASSERT_EQ(cached.http.status, 200) << describe(cached);
  wait_for_publishes(proxy, 2);

  daemon_.stop();
  const ChatResult again = post_chat(proxy.url(), first);
  ASSERT_EQ(again.http.status, 200) << describe(again);
  EXPECT_EQ(again.content, cached.content);
  const ChatRequest other = chat(conversation(head_text(55), user_text(51)), /*stream=*/true);
  const ChatResult uncached = post_chat(proxy.url(), other);
  ASSERT_EQ(uncached.http.status, 200) << describe(uncached);
  const ChatResult direct = post_chat(server.url(), reference(other));
  EXPECT_EQ(uncached.content, direct.content);
  EXPECT_EQ(uncached.finish_reason, direct.finish_reason);
  ProxyStatus status = get_proxy_status(proxy.url());
  ASSERT_TRUE(status.parsed) << status.body;
  EXPECT_FALSE(status.kvparkd_connected) << status.body;
  EXPECT_GT(status.uncached_requests, 0) << status.body;

  // kvparkd back on the same socket: the proxy reconnects and parks again.
  ASSERT_TRUE(daemon_.start());
  const int64_t publishes_down = status.publishes;
  // Each try is a new turn: the proxy reconnects and publishes it once kvparkd is back.
  uint64_t turn = 60;
  (void)wait_until(
      [&] {
        const ChatResult r = post_chat(proxy.url(), chat(conversation(system, user_text(turn++))));
        EXPECT_EQ(r.http.status, 200) << describe(r);
        status = get_proxy_status(proxy.url());
        return r.http.status != 200 || (status.kvparkd_connected && status.publishes > publishes_down);
      },
      reconnect_wait_msec_max);
  EXPECT_TRUE(status.kvparkd_connected) << status.body;
  EXPECT_GT(status.publishes, publishes_down) << status.body;
}

TEST_F(ProxyE2E, ResponsesMatchDirectLlamaServer) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(6);
  // The first request prefills the head; the later ones reuse it (slot or kvparkd).
  const std::initializer_list<std::pair<int, bool>> requests = {
      {60, false}, {61, true}, {62, false}, {63, true}};
  for (const auto& [user, stream] : requests) {
    const ChatRequest request = chat(conversation(system, user_text(user)), stream);
    const ChatResult via = post_chat(proxy.url(), request);
    const ChatResult direct = post_chat(server.url(), reference(request));
    ASSERT_EQ(via.http.status, 200) << describe(via);
    ASSERT_EQ(direct.http.status, 200) << describe(direct);
    EXPECT_TRUE(via.parsed) << describe(via);
    EXPECT_EQ(via.content, direct.content) << "user " << user << " stream " << stream;
    EXPECT_EQ(via.finish_reason, direct.finish_reason) << "user " << user;
    EXPECT_FALSE(via.finish_reason.empty()) << describe(via);
    EXPECT_EQ(via.prompt_tokens, direct.prompt_tokens) << "user " << user;
    EXPECT_EQ(via.cached_tokens, expected_cached_tokens(via)) << describe(via);
    if (stream) {
      EXPECT_GE(via.first_chunk_msec, 0) << describe(via);
    }
  }
}

TEST_F(ProxyE2E, MalformedRequestsGet400) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const int64_t before = prompt_tokens_total(server.url());
  struct Case {
    const char* body;
    const char* named;  // a word the error message must contain
  };
  for (const Case& c : {Case{"{\"model\": \"m\", \"messages\": [", "json"},
                        Case{"not json at all", "json"}, Case{"{\"model\": \"m\"}", "messages"},
                        Case{"{\"model\": \"m\", \"messages\": \"hello\"}", "messages"},
                        Case{"{\"model\": \"m\", \"messages\": {\"role\": \"user\"}}", "messages"},
                        Case{"[1, 2, 3]", ""}}) {
    const HttpResult r = http_post(proxy.url(), "/v1/chat/completions", c.body);
    EXPECT_EQ(r.status, 400) << c.body << " -> " << r.body;
    const ErrorBody error = parse_error_body(r.body);
    EXPECT_TRUE(error.parsed) << c.body << " -> " << r.body;
    EXPECT_EQ(error.code, 400) << r.body;
    EXPECT_FALSE(error.type.empty()) << r.body;
    EXPECT_FALSE(error.message.empty()) << r.body;
    EXPECT_NE(lower(error.message).find(c.named), std::string::npos)
        << c.body << " -> " << error.message;
  }
  EXPECT_EQ(prompt_tokens_total(server.url()), before) << "a malformed request reached upstream";
  const ChatResult good = post_chat(proxy.url(), chat(conversation("Be brief.", user_text(70))));
  EXPECT_EQ(good.http.status, 200) << describe(good);
}

TEST_F(ProxyE2E, UnknownModelGets404) {
  LlamaServerProcess& one = start_server();
  LlamaServerProcess& two = start_server();
  ProxyProcess& proxy =
      start_proxy({{.name = "m1", .url = one.url()}, {.name = "m2", .url = two.url()}});
  ChatRequest request = chat(conversation("Be brief.", user_text(80)));
  request.model = "no-such-model";
  const ChatResult unknown = post_chat(proxy.url(), request);
  EXPECT_EQ(unknown.http.status, 404) << describe(unknown);
  const ErrorBody error = parse_error_body(unknown.http.body);
  EXPECT_TRUE(error.parsed) << unknown.http.body;
  EXPECT_EQ(error.code, 404) << unknown.http.body;

  // Known names route to their own upstream.
  const int64_t one_before = prompt_tokens_total(one.url());
  const int64_t two_before = prompt_tokens_total(two.url());
  request.model = "m2";
  const ChatResult routed = post_chat(proxy.url(), request);
  ASSERT_EQ(routed.http.status, 200) << describe(routed);
  EXPECT_EQ(prompt_tokens_total(one.url()), one_before);
  EXPECT_GT(prompt_tokens_total(two.url()), two_before);
  const ProxyStatus status = get_proxy_status(proxy.url());
  ASSERT_EQ(status.upstreams.size(), 2u) << status.body;
}

TEST_F(ProxyE2E, UpstreamDownGets502) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const ChatRequest request = chat(conversation("Be brief.", user_text(90)));
  ASSERT_EQ(post_chat(proxy.url(), request).http.status, 200);

  server.stop();  // its port is closed now
  for (bool stream : {false, true}) {
    ChatRequest r = request;
    r.stream = stream;
    const ChatResult down = post_chat(proxy.url(), r);
    EXPECT_EQ(down.http.status, 502) << describe(down);
    const ErrorBody error = parse_error_body(down.http.body);
    EXPECT_TRUE(error.parsed) << down.http.body;
    EXPECT_EQ(error.code, 502) << down.http.body;
    // The body says which llama-server and why, so the operator knows what to fix.
    EXPECT_NE(error.message.find(server.url()), std::string::npos) << error.message;
    EXPECT_NE(error.message.find("could not connect"), std::string::npos) << error.message;
  }
  // The proxy itself stays up, and says its upstream is not.
  const HttpResult health = http_get(proxy.url(), "/health");
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_NE(health.body.find(server.url()), std::string::npos) << health.body;

  ASSERT_TRUE(server.start()) << server.log_tail();  // same port: the proxy recovers
  const ChatResult back = post_chat(proxy.url(), request);
  EXPECT_EQ(back.http.status, 200) << describe(back);
}

TEST_F(ProxyE2E, RefusedRestoreFallsBackToPrefill) {
  LlamaServerProcess& server = start_server({"-ctk", "f16", "-ctv", "f16"}, wide_model_path());
  // Whole slot files: parked as blocks, a slot file of the new layout would tell the
  // proxy (BlocksTest.AnUpstreamRestartedWithAnotherCacheTypeIsCheckedAgain).
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: ready", {"--park-as", "whole"});
  const std::string system = head_text(7);
  std::vector<ChatMessage> messages = conversation(system, user_text(100));
  const ChatResult turn1 = post_chat(proxy.url(), chat(messages));
  ASSERT_EQ(turn1.http.status, 200) << describe(turn1);
  wait_for_publishes(proxy, 2);
  const std::string first_space = get_proxy_status(proxy.url()).upstreams.at(0).space;

  // Same model, same port and slot directory, another K cache type: every f16 state
  // the proxy parked is refused by llama-server's restore. The proxy is not told.
  server.stop();
  server.config().extra_args = {"-ctk", "q8_0"};
  ASSERT_TRUE(server.start()) << server.log_tail();
  messages.push_back({"assistant", turn1.content});
  messages.push_back({"user", user_text(101)});
  const ChatResult turn2 = post_chat(proxy.url(), chat(messages));
  ASSERT_EQ(turn2.http.status, 200) << describe(turn2);
  const ChatResult direct = post_chat(server.url(), reference(chat(messages)));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(turn2.content, direct.content);
  EXPECT_EQ(turn2.finish_reason, direct.finish_reason);
  EXPECT_EQ(turn2.header_int("x-kvpark-restored-tokens"), 0) << describe(turn2);
  EXPECT_EQ(turn2.cached_tokens, expected_cached_tokens(turn2)) << describe(turn2);
  const ProxyStatus status = get_proxy_status(proxy.url());
  EXPECT_EQ(status.restore_failures, 1) << status.body;

  expect_fresh_namespace_after_second_refusal(system, 110, first_space);
}

// A parked state damaged in the arena (a payload that fails its checksum, written
// here by a client of kvparkd in the proxy's namespace, as a buggy or hostile member
// of the kvpark group could) is never given to llama-server: the request is
// prefilled and answered as llama-server answers it directly.
TEST_F(ProxyE2E, CorruptParkedStateIsRefusedAndPrefilled) {
  LlamaServerProcess& server = start_server();
  // Whole slot files (a corrupt block: BlocksTest.ACorruptBlockIsRefusedAndPrefilled).
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: ready", {"--park-as", "whole"});
  const std::string system = head_text(9);
  // The proxy's head: what renderings with two stand-in user turns share.
  auto render = [&](const char* standin) {
    ChatRequest r = chat(conversation(system, standin));
    const HttpResult prompt = http_post(server.url(), "/apply-template", chat_request_json(r));
    std::vector<int32_t> tokens;
    tokenize(server.url(), prompt_of(prompt.body), /*special=*/true, &tokens);
    return tokens;
  };
  const std::vector<int32_t> a = render("a");
  const std::vector<int32_t> b = render("b");
  ASSERT_FALSE(a.empty());
  size_t head = 0;
  while (head < a.size() && head < b.size() && a[head] == b[head]) ++head;
  ASSERT_GT(head, 1000u);

  ASSERT_TRUE(get_proxy_status(proxy.url()).parsed);
  const std::string space = get_proxy_status(proxy.url()).upstreams.at(0).space;
  ASSERT_EQ(space.size(), 32u);
  ASSERT_TRUE(park_corrupt_snapshot(daemon_.socket_path(), space, a, head));

  const ChatRequest request = chat(conversation(system, user_text(120)));
  const ChatResult via = post_chat(proxy.url(), request);
  ASSERT_EQ(via.http.status, 200) << describe(via);
  const ChatResult direct = post_chat(server.url(), reference(request));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(via.content, direct.content);
  EXPECT_EQ(via.header_int("x-kvpark-restored-tokens"), 0) << describe(via);
  EXPECT_GE(via.prompt_n, int64_t(head)) << "the head must have been prefilled: " << describe(via);
  EXPECT_EQ(get_proxy_status(proxy.url()).restore_failures, 1);
  // Refused by the proxy's own check, before llama-server saw a byte.
  EXPECT_NE(proxy.log_tail().find("checksum mismatch"), std::string::npos) << proxy.log_tail();

  expect_fresh_namespace_after_second_refusal(system, 130, space);
}

// Clients that hang up mid-stream (more of them than the upstream has slots) cost
// nothing to the next client: their generations are cancelled and their slots given
// back.
TEST_F(ProxyE2E, ClientsThatHangUpMidStreamGiveTheirSlotsBack) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(11);
  for (int i = 0; i < 6; ++i) {
    ChatRequest r = chat(conversation(system, user_text(140 + i)), /*stream=*/true);
    r.max_tokens = 2000;  // would run for a long time if not cancelled
    httplib::Client client(proxy.url());
    size_t received = 0;
    httplib::Request request;
    request.method = "POST";
    request.path = "/v1/chat/completions";
    request.body = chat_request_json(r);
    request.set_header("Content-Type", "application/json");
    request.content_receiver = [&](const char*, size_t n, uint64_t, uint64_t) {
      received += n;
      return false;  // hang up at the first chunk
    };
    httplib::Response response;
    httplib::Error error = httplib::Error::Success;
    client.send(request, response, error);
    EXPECT_GT(received, 0u) << "request " << i << ": " << httplib::to_string(error);
  }
  const ChatRequest next = chat(conversation(system, user_text(150)));
  const ChatResult after = post_chat(proxy.url(), next, /*timeout_msec=*/60'000);
  ASSERT_EQ(after.http.status, 200) << describe(after);
  const ChatResult direct = post_chat(server.url(), reference(next));
  EXPECT_EQ(after.content, direct.content);
  // The last request gives its slot back once its turn is parked, after its response.
  HttpResult status;
  (void)wait_until(
      [&] {
        status = http_get(proxy.url(), "/kvpark/status");
        return status.body.find("\"busy_slots\":0") != std::string::npos;
      },
      publish_wait_msec_max);
  EXPECT_NE(status.body.find("\"busy_slots\":0"), std::string::npos) << status.body;
}

TEST_F(ProxyE2E, HealthStatusAndPassThroughAnswer) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const HttpResult health = http_get(proxy.url(), "/health");
  EXPECT_EQ(health.status, 200);
  EXPECT_NE(health.body.find("\"ok\""), std::string::npos) << health.body;

  // Status after a request: the proxy learns its upstreams and kvparkd lazily.
  const ChatResult first = post_chat(proxy.url(), chat(conversation("Be brief.", user_text(8))));
  ASSERT_EQ(first.http.status, 200) << describe(first);
  const ProxyStatus status = get_proxy_status(proxy.url());
  ASSERT_TRUE(status.parsed) << status.body;
  EXPECT_TRUE(status.kvparkd_connected) << status.body;
  EXPECT_GE(status.requests, 1) << status.body;
  ASSERT_EQ(status.upstreams.size(), 1u) << status.body;
  EXPECT_EQ(status.upstreams[0].name, "m");
  EXPECT_EQ(status.upstreams[0].url, server.url());
  EXPECT_EQ(status.upstreams[0].slots, 4) << status.body;
  EXPECT_EQ(status.upstreams[0].space.size(), 32u) << status.body;
  EXPECT_TRUE(std::all_of(status.upstreams[0].space.begin(), status.upstreams[0].space.end(),
                          [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); }))
      << status.body;

  const HttpResult models = http_get(proxy.url(), "/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_NE(models.body.find("\"data\""), std::string::npos) << models.body;
  const std::string tokenize = "{\"content\": \"the park cache state\"}";
  const HttpResult via = http_post(proxy.url(), "/tokenize", tokenize);
  const HttpResult direct = http_post(server.url(), "/tokenize", tokenize);
  EXPECT_EQ(via.status, 200);
  EXPECT_EQ(via.body, direct.body);
}

TEST_F(ProxyE2E, SingleUpstreamTakesAnyModelName) {
  start_server();
  ProxyProcess& proxy = start_proxy();
  for (const char* model : {"", "m", "gpt-4o"}) {
    ChatRequest request = chat(conversation("Be brief.", user_text(110)));
    request.model = model;
    const ChatResult r = post_chat(proxy.url(), request);
    EXPECT_EQ(r.http.status, 200) << "model \"" << model << "\": " << describe(r);
  }
}

}  // namespace
}  // namespace kvpark::testing
