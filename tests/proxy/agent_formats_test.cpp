// kvpark-proxy's other two front doors end to end: OpenAI Responses and Anthropic
// Messages, with request bodies shaped as the official SDKs send them
// (tests/testing/agent_http.h), against a real kvparkd, llama-server and proxy.
// What was prefilled is read from llama-server's own /metrics.
#include <rapidjson/document.h>

#include <thread>

#include "tests/proxy/fault_upstream.h"
#include "tests/proxy/proxy_e2e.h"
#include "tests/testing/agent_http.h"

namespace kvpark::testing {
namespace {

AgentRequest agent(WireFormat format, const std::string& system, uint64_t user,
                   bool stream = false) {
  AgentRequest r;
  r.format = format;
  r.system = system;
  r.turns = {{"user", user_text(user)}};
  r.stream = stream;
  return r;
}

std::string describe(const AgentResult& r) {
  return "status=" + std::to_string(r.http.status) + " reuse=" + r.http.header("x-kvpark-reuse") +
         " restored=" + r.http.header("x-kvpark-restored-tokens") +
         " prompt_tokens=" + std::to_string(r.prompt_tokens) +
         " cached=" + std::to_string(r.cached_tokens) +
         " created=" + std::to_string(r.cache_creation_tokens) +
         " input=" + std::to_string(r.input_tokens) + " content=\"" + r.content +
         "\" body=" + r.http.body.substr(0, 600);
}

// A request through the proxy and the tokens llama-server prefilled meanwhile.
struct Measured {
  AgentResult result;
  int64_t prefilled = 0;
};
Measured post_measured(const std::string& proxy_url, const std::string& server_url,
                       const AgentRequest& request) {
  const int64_t before = prompt_tokens_total(server_url);
  Measured m{.result = post_agent(proxy_url, request)};
  m.prefilled = prompt_tokens_total(server_url) - before;
  return m;
}

// The proxy's figures for one front door (/kvpark/status "apis").
int64_t api_figure(const std::string& proxy_url, const char* api, const char* figure) {
  const HttpResult r = http_get(proxy_url, "/kvpark/status");
  rapidjson::Document doc;
  if (r.status != 200 || doc.Parse(r.body.c_str()).HasParseError() || !doc.HasMember("apis") ||
      !doc["apis"].HasMember(api) || !doc["apis"][api].HasMember(figure))
    return -1;
  return doc["apis"][api][figure].GetInt64();
}

// Tokens the proxy's verification of an upstream prefills (1, then 2: verify.cpp).
constexpr int64_t verification_tokens = 3;

const char* api_name(WireFormat format) {
  return format == WireFormat::responses ? "responses" : "messages";
}

class AgentFormatsE2E : public ProxyE2E, public ::testing::WithParamInterface<WireFormat> {
 protected:
  // Usage must say what llama-server really prefilled for the request: its cached
  // figure is the prompt less that.
  // After a restart the proxy may verify the new process meanwhile (a slot-file round
  // trip that prefills verification_tokens), which llama-server's counter sees too.
  static void expect_usage_matches(const Measured& m, bool after_restart = false) {
    const AgentResult& r = m.result;
    const int64_t uncounted_max = after_restart ? verification_tokens : 0;
    EXPECT_GE(r.cached_tokens, r.prompt_tokens - m.prefilled) << describe(r);
    EXPECT_LE(r.cached_tokens, r.prompt_tokens - m.prefilled + uncounted_max) << describe(r);
    // Messages: each of these turns is parked with its closure, so all it prefilled was
    // written to the cache for later requests.
    if (r.cache_creation_tokens >= 0) {
      EXPECT_EQ(r.input_tokens, 0) << describe(r);
      EXPECT_GT(r.cache_creation_tokens, 0) << describe(r);
    }
  }
};

TEST_P(AgentFormatsE2E, SiblingsShareTheHeadAndARestartedServerPrefillsOnlyTheDelta) {
  const WireFormat format = GetParam();
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(40 + uint64_t(format));
  const int64_t head_tokens = count_tokens(server.url(), system);
  ASSERT_GT(head_tokens, 1000);

  const Measured a = post_measured(proxy.url(), server.url(), agent(format, system, 401));
  ASSERT_EQ(a.result.http.status, 200) << describe(a.result);
  ASSERT_TRUE(a.result.parsed) << describe(a.result);
  ASSERT_GT(a.result.prompt_tokens, head_tokens) << describe(a.result);
  expect_usage_matches(a);
  wait_for_publishes(proxy, 2);  // the head and A's turn

  // A sibling: no marker anywhere, the same head.
  const Measured b = post_measured(proxy.url(), server.url(), agent(format, system, 402));
  ASSERT_EQ(b.result.http.status, 200) << describe(b.result);
  EXPECT_LE(b.prefilled, b.result.prompt_tokens - head_tokens + token_slack) << describe(b.result);
  expect_usage_matches(b);
  EXPECT_GE(b.result.cached_tokens, head_tokens - token_slack) << describe(b.result);

  // A new llama-server process: nothing in any slot. Streamed, then the same unstreamed.
  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  const AgentRequest sibling = agent(format, system, 403, /*stream=*/true);
  const Measured c = post_measured(proxy.url(), server.url(), sibling);
  ASSERT_EQ(c.result.http.status, 200) << describe(c.result);
  EXPECT_TRUE(c.result.stream_closed) << describe(c.result);
  EXPECT_EQ(c.result.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(c.result);
  EXPECT_GE(c.result.header_int("x-kvpark-restored-tokens"), head_tokens) << describe(c.result);
  EXPECT_LE(c.prefilled, c.result.prompt_tokens - head_tokens + token_slack) << describe(c.result);
  expect_usage_matches(c, /*after_restart=*/true);
  AgentRequest whole = sibling;
  whole.stream = false;
  const AgentResult c_whole = post_agent(proxy.url(), whole);
  ASSERT_EQ(c_whole.http.status, 200) << describe(c_whole);
  EXPECT_EQ(c_whole.content, c.result.content) << "streamed and whole answers differ";

  // llama-server's own endpoint for this format renders the same tokens and answers
  // the same (Responses: nothing cached; Messages keeps no cache_prompt).
  AgentRequest reference = whole;
  reference.cache_prompt = false;
  const AgentResult direct = post_agent(server.url(), reference);
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(direct.prompt_tokens, c.result.prompt_tokens) << describe(direct);
  EXPECT_EQ(direct.content, c.result.content);

  const char* api = api_name(format);
  // Counted once a request finishes, after its response (its turn parked first).
  EXPECT_TRUE(wait_until([&] { return api_figure(proxy.url(), api, "answered") == 4; },
                         publish_wait_msec_max))
      << api_figure(proxy.url(), api, "answered");
  EXPECT_GE(api_figure(proxy.url(), api, "cached_tokens"), 2 * head_tokens);
  const HttpResult metrics = http_get(proxy.url(), "/metrics");
  EXPECT_NE(metrics.body.find("kvpark_proxy_api_requests_total{api=\"" + std::string(api) +
                              "\"} 4"),
            std::string::npos)
      << metrics.body.substr(0, 3000);
}

TEST_P(AgentFormatsE2E, FanOutOfSixPrefillsTheHeadOnce) {
  const WireFormat format = GetParam();
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(50 + uint64_t(format));
  const int64_t head_tokens = count_tokens(server.url(), system);

  const int64_t before = prompt_tokens_total(server.url());
  std::vector<AgentResult> results(fan_out_requests);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < fan_out_requests; ++i)
    clients.emplace_back(
        [&, i] { results[i] = post_agent(proxy.url(), agent(format, system, 500 + i)); });
  for (std::thread& t : clients) t.join();
  const int64_t prefilled = prompt_tokens_total(server.url()) - before;

  int64_t prefilled_max = head_tokens + token_slack;  // the head once
  for (const AgentResult& r : results) {
    ASSERT_EQ(r.http.status, 200) << describe(r);
    prefilled_max += r.prompt_tokens - head_tokens + token_slack;  // each one's own delta
  }
  EXPECT_GE(prefilled, head_tokens);
  EXPECT_LE(prefilled, prefilled_max) << "head tokens " << head_tokens;
  const ProxyStatus status = get_proxy_status(proxy.url());
  EXPECT_EQ(status.head_prefills, 1) << status.body;
}

// A conversation's second turn, sent back in the format's own shape (a Responses
// output message, a Messages assistant block), after llama-server restarted: restored
// from turn 1's closure, only the new turn prefilled, usage telling so.
TEST_P(AgentFormatsE2E, SecondTurnAfterARestartRestoresTheFirst) {
  const WireFormat format = GetParam();
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  AgentRequest request = agent(format, head_text(47 + uint64_t(format)), 471, /*stream=*/true);
  const AgentResult turn1 = post_agent(proxy.url(), request);
  ASSERT_EQ(turn1.http.status, 200) << describe(turn1);
  ASSERT_FALSE(turn1.content.empty()) << describe(turn1);
  wait_for_publishes(proxy, 2);  // the head and the turn

  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  request.turns.push_back({"assistant", turn1.content});
  request.turns.push_back({"user", user_text(472)});
  for (const bool stream : {true, false}) {
    request.stream = stream;
    const Measured turn2 = post_measured(proxy.url(), server.url(), request);
    ASSERT_EQ(turn2.result.http.status, 200) << describe(turn2.result);
    if (stream) {
      EXPECT_EQ(turn2.result.http.header("x-kvpark-reuse"), "private_turn_closure")
          << describe(turn2.result);
      EXPECT_LE(turn2.prefilled, turn2.result.prompt_tokens - turn1.prompt_tokens + token_slack)
          << describe(turn2.result);
    }
    expect_usage_matches(turn2, /*after_restart=*/true);
  }
}

// The restored slot must be the one that answers: Responses go to llama-server's
// /v1/responses with id_slot (its converter keeps it), Messages as the Chat
// Completions body they became (llama-server's Messages converter drops id_slot).
TEST_P(AgentFormatsE2E, RequestsArePinnedToTheSlotTheProxyRestored) {
  const WireFormat format = GetParam();
  LlamaServerProcess& server = start_server();
  FaultUpstream upstream(server.url());  // a relay that remembers what it was sent
  ASSERT_TRUE(upstream.start());
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = upstream.url()}});
  const std::string system = head_text(45 + uint64_t(format));
  ASSERT_EQ(post_agent(proxy.url(), agent(format, system, 451)).http.status, 200);
  const AgentResult b = post_agent(proxy.url(), agent(format, system, 452));
  ASSERT_EQ(b.http.status, 200) << describe(b);
  const char* path =
      format == WireFormat::responses ? "/v1/responses" : "/v1/chat/completions";
  rapidjson::Document sent;
  ASSERT_FALSE(sent.Parse(upstream.last_body(path).c_str()).HasParseError())
      << path << ": " << upstream.last_body(path);
  ASSERT_TRUE(sent.HasMember("id_slot")) << upstream.last_body(path).substr(0, 400);
  EXPECT_EQ(std::to_string(sent["id_slot"].GetInt()), b.http.header("x-kvpark-slot"));
  EXPECT_EQ(format == WireFormat::responses, sent.HasMember("input"));
  EXPECT_EQ(upstream.last_body("/v1/messages"), "") << "sent to llama-server's own Messages";
}

INSTANTIATE_TEST_SUITE_P(Formats, AgentFormatsE2E,
                         ::testing::Values(WireFormat::responses, WireFormat::messages),
                         [](const ::testing::TestParamInfo<WireFormat>& format) {
                           return std::string(api_name(format.param));
                         });

using MessagesE2E = ProxyE2E;

// Claude-Code-style clients stamp the first system line per request; llama-server
// normalises the stamp, and so must the proxy's keys, or no two requests share a head.
TEST_F(MessagesE2E, RequestsDifferingOnlyInTheBillingStampShareTheHead) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(60);
  const int64_t head_tokens = count_tokens(server.url(), system);
  AgentRequest first = agent(WireFormat::messages, system, 601);
  first.billing_cch = "a5145";
  const Measured a = post_measured(proxy.url(), server.url(), first);
  ASSERT_EQ(a.result.http.status, 200) << describe(a.result);
  wait_for_publishes(proxy, 2);

  server.stop();  // the second must come from kvparkd, keyed by the normalised head
  ASSERT_TRUE(server.start()) << server.log_tail();
  AgentRequest second = agent(WireFormat::messages, system, 602);
  second.billing_cch = "9e0c2";
  const Measured b = post_measured(proxy.url(), server.url(), second);
  ASSERT_EQ(b.result.http.status, 200) << describe(b.result);
  EXPECT_EQ(b.result.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(b.result);
  EXPECT_LE(b.prefilled, b.result.prompt_tokens - head_tokens + token_slack) << describe(b.result);
  const ProxyStatus status = get_proxy_status(proxy.url());
  EXPECT_NE(status.body.find("\"billing_headers_normalized\":2"), std::string::npos)
      << status.body;
}

// With the automatic head candidate off, a client's cache_control on its system block
// is what parks the head: a sibling after a restart restores it. An unmarked head
// beside it is not parked, and its sibling prefills it all again. (Whole slot files:
// parked as blocks, the unmarked sibling would restore the blocks of the head that the
// other conversation's turn holds, ProxyBlocks.AConversationCutBackRestoresTheBlocksItShares.)
TEST_F(MessagesE2E, CacheControlOnTheSystemBlockParksTheHead) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: ready",
                                    {"--no-system-candidate", "--park-as", "whole"});
  const std::string marked_system = head_text(70);
  const std::string plain_system = head_text(71);
  const int64_t marked_tokens = count_tokens(server.url(), marked_system);
  const int64_t plain_tokens = count_tokens(server.url(), plain_system);
  AgentRequest marked = agent(WireFormat::messages, marked_system, 701);
  marked.mark_system = true;
  ASSERT_EQ(post_agent(proxy.url(), marked).http.status, 200);
  ASSERT_EQ(post_agent(proxy.url(), agent(WireFormat::messages, plain_system, 711)).http.status,
            200);
  wait_for_publishes(proxy, 3);  // the marked head and both turns

  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  marked.turns = {{"user", user_text(702)}};
  const Measured m = post_measured(proxy.url(), server.url(), marked);
  ASSERT_EQ(m.result.http.status, 200) << describe(m.result);
  EXPECT_LE(m.prefilled, m.result.prompt_tokens - marked_tokens + token_slack)
      << describe(m.result);
  const Measured p =
      post_measured(proxy.url(), server.url(), agent(WireFormat::messages, plain_system, 712));
  ASSERT_EQ(p.result.http.status, 200) << describe(p.result);
  EXPECT_GE(p.prefilled, plain_tokens) << describe(p.result);
}

// Bad input is refused in the client's own error shape, with its cause, and nothing
// reaches llama-server.
TEST_F(ProxyE2E, BadAgentRequestsGetTheirFormatsErrorShape) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const int64_t before = prompt_tokens_total(server.url());
  struct Case {
    const char* path;
    const char* body;
    const char* named;  // a word the message must contain
  };
  for (const Case& c :
       {Case{"/v1/messages", "not json", "json"}, Case{"/v1/messages", "{\"model\":\"m\"}", "messages"},
        Case{"/v1/responses", "{\"model\":\"m\",", "json"},
        Case{"/v1/responses", "{\"model\":\"m\"}", "input"},
        Case{"/v1/responses",
             "{\"model\":\"m\",\"input\":\"hi\",\"previous_response_id\":\"resp_1\"}",
             "previous_response_id"}}) {
    const HttpResult r = http_post(proxy.url(), c.path, c.body);
    EXPECT_EQ(r.status, 400) << c.path << " " << c.body << " -> " << r.body;
    rapidjson::Document doc;
    ASSERT_FALSE(doc.Parse(r.body.c_str()).HasParseError()) << r.body;
    const bool anthropic = std::string(c.path) == "/v1/messages";
    if (anthropic) {
      EXPECT_STREQ(doc["type"].GetString(), "error") << r.body;
    }
    ASSERT_TRUE(doc.HasMember("error") && doc["error"].IsObject()) << r.body;
    EXPECT_STREQ(doc["error"]["type"].GetString(), "invalid_request_error") << r.body;
    EXPECT_NE(lower(doc["error"]["message"].GetString()).find(c.named), std::string::npos)
        << r.body;
  }
  EXPECT_EQ(prompt_tokens_total(server.url()), before) << "a bad request reached llama-server";
}

}  // namespace
}  // namespace kvpark::testing
