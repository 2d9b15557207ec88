// kvpark-proxy end to end: an upstream is verified before it is served cached (a
// llama-server without --slot-save-path, with another slot directory, on a wrong
// port, and each fixed while the proxy runs), honest accounting (the leader of a
// cold head is not told its head was cached; headers, log, /metrics and llama-server
// agree), /metrics in the Prometheus format, routing that spreads a fan-out over two
// upstreams, /v1/models and --version; and what "identical" means (docs/proxy.md):
// the state restored is byte for byte the state parked, and the answer after a
// restore is the answer llama-server gives continuing from its own cached prefix of
// the same length.
#include <dirent.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client/kvpark.h"
#include "integrations/llama/state_image.h"
#include "proxy/slot_file.h"
#include "tests/proxy/proxy_e2e.h"
#include "tests/proxy/proxy_metrics.h"

namespace kvpark::testing {
namespace {

constexpr int state_wait_msec_max = 30'000;  // the watcher retries every second

struct UpstreamView {
  std::string state, reason, space;
  int64_t load = -1;
};

// Upstream `index` as GET /kvpark/status shows it.
UpstreamView upstream_view(const std::string& proxy_url, size_t index = 0) {
  UpstreamView view;
  const HttpResult r = http_get(proxy_url, "/kvpark/status");
  rapidjson::Document doc;
  doc.Parse(r.body.c_str());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("upstreams") ||
      !doc["upstreams"].IsArray() || doc["upstreams"].Size() <= index)
    return view;
  const auto& u = doc["upstreams"][rapidjson::SizeType(index)];
  if (u.HasMember("state") && u["state"].IsString()) view.state = u["state"].GetString();
  if (u.HasMember("reason") && u["reason"].IsString()) view.reason = u["reason"].GetString();
  if (u.HasMember("namespace") && u["namespace"].IsString()) view.space = u["namespace"].GetString();
  if (u.HasMember("load") && u["load"].IsInt64()) view.load = u["load"].GetInt64();
  return view;
}

// Polls until upstream 0 is in `state`; the last view seen.
UpstreamView wait_for_state(const std::string& proxy_url, const std::string& state) {
  UpstreamView view;
  (void)wait_until([&] { return view = upstream_view(proxy_url), view.state == state; },
                   state_wait_msec_max);
  return view;
}

// Polls GET /health until it answers `status`; the last answer.
HttpResult wait_for_health(const std::string& proxy_url, int status) {
  HttpResult health;
  (void)wait_until([&] { return health = http_get(proxy_url, "/health"), health.status == status; },
                   state_wait_msec_max);
  return health;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(ProxyE2E, UpstreamWithoutSlotSavePathIsNotReadyUntilFixed) {
  LlamaServerProcess& server = start_server_in("");
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: listening");
  const UpstreamView view = wait_for_state(proxy.url(), "misconfigured");
  ASSERT_EQ(view.state, "misconfigured") << view.reason;
  EXPECT_TRUE(contains(view.reason, "was started without --slot-save-path")) << view.reason;
  EXPECT_TRUE(contains(view.reason, server.url())) << view.reason;
  const HttpResult health = http_get(proxy.url(), "/health");
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_TRUE(contains(health.body, "--slot-save-path")) << health.body;
  EXPECT_TRUE(contains(proxy.log_tail(),
                       "llama-server at " + server.url() + " was started without --slot-save-path"))
      << proxy.log_tail();

  // Served, uncached: nothing restored, nothing refused, the same answer.
  const ChatRequest request = chat(conversation(head_text(20), user_text(200)));
  const ChatResult via = post_chat(proxy.url(), request);
  ASSERT_EQ(via.http.status, 200) << describe(via);
  EXPECT_EQ(via.http.header("x-kvpark-reuse"), "uncached") << describe(via);
  const ChatResult direct = post_chat(server.url(), reference(request));
  EXPECT_EQ(via.content, direct.content);
  ProxyStatus status = get_proxy_status(proxy.url());
  EXPECT_EQ(status.restore_failures, 0) << status.body;
  EXPECT_EQ(status.head_prefills, 0) << status.body;

  // Fixed on the same port: verified again, then served cached.
  server.stop();
  server.config().slot_dir = slot_dir_;
  ASSERT_TRUE(server.start()) << server.log_tail();
  const HttpResult fixed = wait_for_health(proxy.url(), 200);
  ASSERT_EQ(fixed.status, 200) << fixed.body << "\n" << proxy.log_tail();
  EXPECT_EQ(upstream_view(proxy.url()).state, "ready");
  const ChatResult cached = post_chat(proxy.url(), chat(conversation(head_text(20), user_text(201))));
  ASSERT_EQ(cached.http.status, 200) << describe(cached);
  EXPECT_EQ(cached.http.header("x-kvpark-reuse"), "root") << describe(cached);
  status = get_proxy_status(proxy.url());
  EXPECT_EQ(status.head_prefills, 1) << status.body;
}

TEST_F(ProxyE2E, UpstreamWithAnotherSlotDirectoryIsNotReadyAndKeepsItsNamespace) {
  const std::string elsewhere = test_dir_ + "/elsewhere";
  mkdir(elsewhere.c_str(), 0755);
  LlamaServerProcess& server = start_server_in(elsewhere);
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: listening");
  const UpstreamView view = wait_for_state(proxy.url(), "misconfigured");
  ASSERT_EQ(view.state, "misconfigured") << view.reason;
  EXPECT_TRUE(contains(view.reason, "saves slot files outside the proxy's --slot-dir " + slot_dir_))
      << view.reason;
  EXPECT_TRUE(contains(view.reason, server.url())) << view.reason;
  EXPECT_EQ(http_get(proxy.url(), "/health").status, 503);

  // Siblings while misconfigured: answered, nothing refused, the namespace stays.
  const std::string system = head_text(21);
  for (uint64_t user : {210, 211, 212}) {
    const ChatResult r = post_chat(proxy.url(), chat(conversation(system, user_text(user))));
    ASSERT_EQ(r.http.status, 200) << describe(r);
    EXPECT_EQ(r.http.header("x-kvpark-reuse"), "uncached") << describe(r);
  }
  EXPECT_EQ(get_proxy_status(proxy.url()).restore_failures, 0);
  EXPECT_EQ(upstream_view(proxy.url()).space, view.space);

  server.stop();
  server.config().slot_dir = slot_dir_;
  ASSERT_TRUE(server.start()) << server.log_tail();
  ASSERT_EQ(wait_for_health(proxy.url(), 200).status, 200) << proxy.log_tail();
  // The namespace any proxy computes for this upstream: parked state is shared. (Once
  // verified, the proxy parks blocks of the slot files' layout, in that layout's own
  // namespace.)
  const std::string ready_space = upstream_view(proxy.url()).space;
  if (get_proxy_status(proxy.url()).upstreams.at(0).parking != "blocks") {
    EXPECT_EQ(ready_space, view.space);
  }
  ProxyProcess& other = start_proxy();
  EXPECT_EQ(upstream_view(other.url()).space, ready_space);
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(213))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);
  server.stop();  // nothing in any slot: a sibling through the other proxy restores
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatResult b = post_chat(other.url(), chat(conversation(system, user_text(214))));
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_EQ(b.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(b);
}

TEST_F(ProxyE2E, UpstreamOnAWrongPortIsUnreachableUntilItListens) {
  const int port = free_tcp_port();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = url}}, "kvpark-proxy: listening");
  const UpstreamView view = wait_for_state(proxy.url(), "unreachable");
  ASSERT_EQ(view.state, "unreachable") << view.reason;
  EXPECT_TRUE(contains(view.reason, "llama-server at " + url)) << view.reason;
  EXPECT_TRUE(contains(view.reason, "could not connect")) << view.reason;
  const HttpResult health = http_get(proxy.url(), "/health");
  EXPECT_EQ(health.status, 503) << health.body;
  EXPECT_TRUE(contains(health.body, url)) << health.body;
  const ChatResult down = post_chat(proxy.url(), chat(conversation("Be brief.", user_text(220))));
  EXPECT_EQ(down.http.status, 502) << describe(down);
  const ErrorBody error = parse_error_body(down.http.body);
  EXPECT_TRUE(contains(error.message, url)) << down.http.body;
  EXPECT_TRUE(contains(error.message, "could not connect")) << down.http.body;

  servers_.push_back(std::make_unique<LlamaServerProcess>(
      LlamaServerConfig{.binary = built_binary("KVPARK_LLAMA_SERVER"),
                        .model = model_path(),
                        .slot_dir = slot_dir_},
      test_dir_ + "/llama-server-late.log"));
  ASSERT_TRUE(servers_.back()->start(port)) << servers_.back()->log_tail();
  ASSERT_EQ(wait_for_health(proxy.url(), 200).status, 200) << proxy.log_tail();
  const ChatResult up = post_chat(proxy.url(), chat(conversation(head_text(22), user_text(221))));
  ASSERT_EQ(up.http.status, 200) << describe(up);
  EXPECT_EQ(up.http.header("x-kvpark-reuse"), "root") << describe(up);
}

// The first request for a head leads: the head is prefilled for it (in a call of its
// own), so none of it is cached for it. Its figures agree everywhere: the usage, the
// X-Kvpark-* headers, the log line, /metrics, and llama-server's own prompt total.
TEST_F(ProxyE2E, LeaderOfAColdHeadIsNotToldItsHeadWasCached) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy();
  const std::string system = head_text(23);
  const int64_t head_tokens = count_tokens(server.url(), system);
  const int64_t before = prompt_tokens_total(server.url());
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(230))));
  const int64_t a_total = prompt_tokens_total(server.url()) - before;
  ASSERT_EQ(a.http.status, 200) << describe(a);
  EXPECT_EQ(a.http.header("x-kvpark-reuse"), "root") << describe(a);
  EXPECT_LE(a.cached_tokens, token_slack) << describe(a);
  EXPECT_EQ(a.header_int("x-kvpark-cached-tokens"), a.cached_tokens) << describe(a);
  const int64_t a_prefilled = a.header_int("x-kvpark-prefilled-tokens");
  EXPECT_EQ(a_prefilled, a.prompt_tokens - a.cached_tokens) << describe(a);
  EXPECT_EQ(a_prefilled, a_total) << "llama-server prompt_tokens_total delta";
  wait_for_publishes(proxy, 2);  // the log line comes after the turn is parked
  const std::string a_line = "reuse=root cached=" + std::to_string(a.cached_tokens) + "/" +
                             std::to_string(a.prompt_tokens) +
                             " prefilled=" + std::to_string(a_prefilled) + " restored=0";
  EXPECT_TRUE(contains(proxy.log_tail(), a_line)) << a_line << "\n" << proxy.log_tail();

  // A sibling on the same server: the head is in a slot, cached for it.
  const ChatResult b = post_chat(proxy.url(), chat(conversation(system, user_text(231))));
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_EQ(b.http.header("x-kvpark-reuse"), "slot") << describe(b);
  EXPECT_GE(b.cached_tokens, head_tokens - token_slack) << describe(b);
  EXPECT_EQ(b.cached_tokens, b.prompt_tokens - b.prompt_n) << describe(b);

  // A streamed leader of another head: its final usage says the same. Its slot may
  // hold the template's opening tokens from A or B (reuse "slot"): those, and only
  // those, are cached for it.
  ChatRequest c_request = chat(conversation(head_text(24), user_text(232)), /*stream=*/true);
  const ChatResult c = post_chat(proxy.url(), c_request);
  ASSERT_EQ(c.http.status, 200) << describe(c);
  ASSERT_GT(c.prompt_tokens, 1000) << describe(c);
  EXPECT_LT(c.cached_tokens, c.prompt_tokens / 20) << describe(c);
  wait_for_publishes(proxy, 5);

  const PromDocument m = scrape(proxy.url());
  const double c_root = c.http.header("x-kvpark-reuse") == "root" ? 1 : 0;
  EXPECT_EQ(metric(m, "kvpark_proxy_requests_total", {{"reuse", "root"}}), 1 + c_root);
  EXPECT_EQ(metric(m, "kvpark_proxy_requests_total", {{"reuse", "slot"}}), 2 - c_root);
  EXPECT_EQ(metric(m, "kvpark_proxy_requests_total", {{"reuse", "uncached"}}), 0);
  EXPECT_EQ(metric(m, "kvpark_proxy_prompt_tokens_total"),
            a.prompt_tokens + b.prompt_tokens + c.prompt_tokens);
  EXPECT_EQ(metric(m, "kvpark_proxy_cached_tokens_total"),
            a.cached_tokens + b.cached_tokens + c.cached_tokens);
  EXPECT_EQ(metric(m, "kvpark_proxy_prefilled_tokens_total"),
            a.prompt_tokens + b.prompt_tokens + c.prompt_tokens -
                (a.cached_tokens + b.cached_tokens + c.cached_tokens));
  EXPECT_EQ(metric(m, "kvpark_proxy_prefilled_tokens_total"),
            prompt_tokens_total(server.url()) - before)
      << "the proxy's prefilled tokens are llama-server's";
  EXPECT_EQ(metric(m, "kvpark_proxy_head_prefills_total"), 2);
  EXPECT_EQ(metric(m, "kvpark_proxy_restore_failures_total", {{"cause", "refused"}}), 0);
  const std::map<std::string, std::string> upstream = {{"upstream", "m"}, {"url", server.url()}};
  EXPECT_EQ(metric(m, "kvpark_proxy_upstream_up", upstream), 1);
  EXPECT_EQ(metric(m, "kvpark_proxy_upstream_slots", upstream), 4);
  EXPECT_EQ(metric(m, "kvpark_proxy_kvparkd_connected"), 1);
}

// Two llama-servers of one model behind one proxy, six requests at once over a new
// head: requests waiting for the head's flight count toward their upstream's load,
// so both upstreams serve; the head is prefilled once, the other server's requests
// restore it from kvparkd.
TEST_F(ProxyE2E, FanOutOverTwoUpstreamsUsesBoth) {
  LlamaServerProcess& one = start_server();
  LlamaServerProcess& two = start_server();
  ProxyProcess& proxy = start_proxy({{.name = "m", .url = one.url()}, {.name = "m", .url = two.url()}});
  const std::string system = head_text(25);
  const int64_t head_tokens = count_tokens(one.url(), system);
  const int64_t one_before = prompt_tokens_total(one.url());
  const int64_t two_before = prompt_tokens_total(two.url());
  std::vector<ChatResult> results(fan_out_requests);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < fan_out_requests; ++i)
    clients.emplace_back([&, i] {
      results[i] = post_chat(proxy.url(), chat(conversation(system, user_text(250 + i))));
    });
  for (std::thread& t : clients) t.join();
  const int64_t one_prefilled = prompt_tokens_total(one.url()) - one_before;
  const int64_t two_prefilled = prompt_tokens_total(two.url()) - two_before;
  int64_t prefilled_max = head_tokens + token_slack;
  int64_t restored = 0;
  for (const ChatResult& r : results) {
    ASSERT_EQ(r.http.status, 200) << describe(r);
    prefilled_max += r.prompt_tokens - head_tokens + token_slack;
    if (r.http.header("x-kvpark-reuse") == "shared_stable_prefix") ++restored;
  }
  EXPECT_GT(one_prefilled, 0) << "upstream one served nothing";
  EXPECT_GT(two_prefilled, 0) << "upstream two served nothing";
  EXPECT_LE(one_prefilled + two_prefilled, prefilled_max) << "head tokens " << head_tokens;
  EXPECT_GE(restored, 1) << "the other upstream's requests restore the head";
  const ProxyStatus status = get_proxy_status(proxy.url());
  EXPECT_EQ(status.head_prefills, 1) << status.body;
  EXPECT_GE(status.head_waits, 1) << status.body;
  // Both under the one name /v1/models lists.
  const HttpResult models = http_get(proxy.url(), "/v1/models");
  EXPECT_EQ(models.status, 200);
  EXPECT_TRUE(contains(models.body, "\"id\":\"m\"")) << models.body;
}

TEST_F(ProxyE2E, ModelsListsTheConfiguredNames) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy({{.name = "qwen-small", .url = server.url()}});
  const HttpResult models = http_get(proxy.url(), "/v1/models");
  EXPECT_EQ(models.status, 200);
  rapidjson::Document doc;
  doc.Parse(models.body.c_str());
  ASSERT_TRUE(!doc.HasParseError() && doc.IsObject() && doc.HasMember("data") &&
              doc["data"].IsArray())
      << models.body;
  ASSERT_EQ(doc["data"].Size(), 1u) << models.body;
  EXPECT_STREQ(doc["data"][0]["id"].GetString(), "qwen-small");
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The slot file kvparkd holds for the longest parked prefix of `tokens` in the
// upstream's namespace (position in *ret_position); "" if none. Whole slot files: the
// payload after its header. Blocks: the file written again from kvparkd's blocks and
// tail in the layout of `like_file` (a slot file of this upstream), by the test's own
// call of the state-image writer.
std::string parked_slot_file(const std::string& socket, const ProxyUpstreamStatus& upstream,
                             const std::vector<int32_t>& tokens, const std::string& like_file,
                             uint32_t* ret_position) {
  const uint32_t block_tokens = uint32_t(std::max<int64_t>(0, upstream.block_tokens));
  const kvpark_namespace ns = proxy_namespace(upstream.space, "reading-test", block_tokens,
                                              uint64_t(std::max<int64_t>(0, upstream.block_bytes)));
  kvpark_client* client = nullptr;
  if (kvpark_connect(socket.c_str(), &ns, &client) != KVPARK_OK) return "";
  std::string bytes;
  kvpark_plan* plan = nullptr;
  if (kvpark_lookup(client, 7, tokens.data(), tokens.size(), &plan) == KVPARK_OK) {
    uint64_t payload_bytes = 0;
    const void* payload = kvpark_plan_snapshot(plan, &payload_bytes, ret_position);
    if (block_tokens == 0) {
      if (payload != nullptr && payload_bytes > sizeof(SealedPayloadHeader))
        bytes.assign(static_cast<const char*>(payload) + sizeof(SealedPayloadHeader),
                     payload_bytes - sizeof(SealedPayloadHeader));
    } else {
      llama::StateImage like;
      std::string why;
      EXPECT_TRUE(llama::parse_state_image(
          std::span(reinterpret_cast<const uint8_t*>(like_file.data()), like_file.size()),
          llama::ImageKind::slot_file, &like, &why))
          << why;
      std::vector<std::vector<uint8_t>> runs;
      for (size_t i = 0; i < kvpark_plan_block_count(plan); ++i) {
        runs.emplace_back(ns.block_payload_bytes);
        EXPECT_EQ(kvpark_plan_copy_block(plan, i, runs.back().data()), KVPARK_OK);
      }
      *ret_position = kvpark_plan_restorable_tokens(plan);
      if (payload != nullptr) {  // the tail
        const auto* body = static_cast<const uint8_t*>(payload) + sizeof(SealedPayloadHeader);
        runs.emplace_back(body, body + payload_bytes - sizeof(SealedPayloadHeader));
      }
      if (*ret_position > 0)
        llama::write_state_image(
            like.layout, std::span(tokens.data(), *ret_position), *ret_position, block_tokens,
            [&](uint32_t r) { return runs.at(r).data(); },
            [&](std::span<const iovec> pieces) {
              for (const iovec& p : pieces)
                bytes.append(static_cast<const char*>(p.iov_base), p.iov_len);
              return true;
            });
    }
    kvpark_plan_release(plan);
  }
  kvpark_disconnect(client);
  return bytes;
}

// The request's body with "id_slot" and "cache_prompt": true added.
std::string pinned_body(const ChatRequest& r, int slot) {
  rapidjson::Document doc;
  doc.Parse(chat_request_json(r).c_str());
  doc.AddMember("id_slot", slot, doc.GetAllocator());
  doc.RemoveMember("cache_prompt");
  doc.AddMember("cache_prompt", true, doc.GetAllocator());
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  doc.Accept(w);
  return buffer.GetString();
}

std::string content_of(const HttpResult& r) {
  rapidjson::Document doc;
  doc.Parse(r.body.c_str());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("choices")) return "";
  const auto& m = doc["choices"][0]["message"];
  return m.HasMember("content") && m["content"].IsString() ? m["content"].GetString() : "";
}

// What the proxy guarantees, exactly: the slot file llama-server restores is the
// one kvparkd holds, byte for byte, and the answer after the restore equals the
// answer llama-server gives when it continues from its own cached prefix of the
// same length (the head prefilled alone, then the request). Not: equal to a
// one-shot prefill of the whole prompt, whose batch shapes differ (at realistic
// sizes the floating-point sums then differ too, with or without the proxy).
class RestoredState : public ProxyE2E, public ::testing::WithParamInterface<const char*> {};

TEST_P(RestoredState, IsTheParkedBytesAndAnswersAsLlamaServersOwnContinuation) {
  LlamaServerProcess& server = start_server();
  ProxyProcess& proxy = start_proxy({}, "kvpark-proxy: ready", {"--park-as", GetParam()});
  EXPECT_EQ(get_proxy_status(proxy.url()).upstreams.at(0).parking.substr(0, 5),
            std::string(GetParam()).substr(0, 5));
  const std::string system = head_text(26);
  const ChatResult a = post_chat(proxy.url(), chat(conversation(system, user_text(260))));
  ASSERT_EQ(a.http.status, 200) << describe(a);
  wait_for_publishes(proxy, 2);
  server.stop();  // nothing in any slot: B's head can only come from kvparkd
  ASSERT_TRUE(server.start()) << server.log_tail();
  const ChatRequest b_request = chat(conversation(system, user_text(261)));
  const ChatResult b = post_chat(proxy.url(), b_request);
  ASSERT_EQ(b.http.status, 200) << describe(b);
  ASSERT_EQ(b.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(b);
  const int64_t head = b.header_int("x-kvpark-restored-tokens");
  ASSERT_GT(head, 1000) << describe(b);

  // The file llama-server restored from (kept for the slot's next restore) is the
  // parked payload, byte for byte.
  std::string restore_file;
  if (DIR* d = opendir(slot_dir_.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 8 && name.compare(name.size() - 8, 8, ".restore") == 0)
        restore_file = slot_dir_ + "/" + name;
    }
    closedir(d);
  }
  ASSERT_FALSE(restore_file.empty()) << "no restore file in " << slot_dir_;
  const HttpResult rendered =
      http_post(server.url(), "/apply-template", chat_request_json(b_request));
  std::vector<int32_t> tokens;
  ASSERT_TRUE(tokenize(server.url(), prompt_of(rendered.body), /*special=*/true, &tokens));
  uint32_t position = 0;
  // The head and one token: the longest parked prefix of that is the head (B's own
  // turn, parked since, covers more of B's prompt).
  tokens.resize(size_t(head) + 1);
  const std::string restored = read_whole(restore_file);
  const std::string parked = parked_slot_file(
      daemon_.socket_path(), get_proxy_status(proxy.url()).upstreams.at(0), tokens, restored,
      &position);
  ASSERT_EQ(position, uint32_t(head));
  ASSERT_FALSE(parked.empty());
  EXPECT_EQ(restored.size(), parked.size());
  EXPECT_TRUE(restored == parked) << "the restored slot file differs from the parked one";

  // llama-server's own continuation: a fresh process prefills the head alone into
  // a slot (as the leader did), then the same request pinned there reuses it.
  proxy.stop();
  server.stop();
  ASSERT_TRUE(server.start()) << server.log_tail();
  std::string prefill = "{\"prompt\": [";
  for (int64_t i = 0; i < head; ++i) prefill += (i ? "," : "") + std::to_string(tokens[size_t(i)]);
  prefill += "], \"n_predict\": 0, \"id_slot\": 0, \"cache_prompt\": true}";
  ASSERT_EQ(http_post(server.url(), "/completion", prefill).status, 200);
  const HttpResult own = http_post(server.url(), "/v1/chat/completions", pinned_body(b_request, 0));
  ASSERT_EQ(own.status, 200) << own.body;
  EXPECT_EQ(b.content, content_of(own));
  EXPECT_FALSE(b.content.empty());
}

INSTANTIATE_TEST_SUITE_P(ParkedAs, RestoredState, ::testing::Values("blocks", "whole"),
                         [](const auto& param_info) { return std::string(param_info.param); });

TEST(ProxyBinary, PrintsItsVersion) {
  const std::string proxy = built_binary("KVPARK_PROXY");
  if (proxy.empty()) GTEST_SKIP() << "needs KVPARK_PROXY";
  std::string out;
  EXPECT_EQ(run_process({proxy, "--version"}, 10'000, &out), 0);
  EXPECT_EQ(out.rfind("kvpark-proxy ", 0), 0u) << out;
  EXPECT_GT(out.size(), std::string("kvpark-proxy \n").size()) << out;
}

}  // namespace
}  // namespace kvpark::testing
