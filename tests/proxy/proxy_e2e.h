// The fixture of kvpark-proxy's end-to-end tests (proxy_test.cpp, verify_test.cpp):
// a real kvparkd, real llama-server upstreams (the project's
// random-weight test model, CPU) and the real proxy, driven over HTTP like any
// OpenAI client. What was prefilled is read from llama-server itself
// (timings.prompt_n per request, llamacpp:prompt_tokens_total per server), so the
// tests hold however the proxy arranges its work. Reference answers come from direct
// requests with "cache_prompt": false: a full prefill no cache touched.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <httplib.h>
#include <rapidjson/document.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/kvpark.h"
#include "proto/names.h"
#include "proxy/slot_file.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/llama_server_process.h"
#include "tests/testing/openai_http.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {

inline constexpr size_t head_words = 550;  // about 2100 tokens: well over the 256-token minimum
inline constexpr size_t user_words = 30;
// Tokens a measured span may be off by: chat-template wrappers, the token llama-server
// always re-evaluates, tokenizer merges at a boundary. A head is ~2000 tokens.
inline constexpr int64_t token_slack = 16;
inline constexpr size_t fan_out_requests = 6;
inline constexpr int publish_wait_msec_max = 15'000;
inline constexpr int reconnect_wait_msec_max = 20'000;

inline std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

inline bool executable(const char* env_name) {
  const std::string path = built_binary(env_name);
  return !path.empty() && access(path.c_str(), X_OK) == 0;
}

inline std::string head_text(uint64_t seed) {
  return english_text(head_words, seed);
}
inline std::string user_text(uint64_t n) {
  return "Question " + std::to_string(n) + ":" + english_text(user_words, 1000 + n) + "?";
}

inline std::vector<ChatMessage> conversation(const std::string& system, const std::string& user) {
  return {{"system", system}, {"user", user}};
}

inline ChatRequest chat(std::vector<ChatMessage> messages, bool stream = false) {
  ChatRequest r;
  r.model = "m";
  r.messages = std::move(messages);
  r.stream = stream;
  return r;
}

// A fan-out: fan_out_requests siblings over `system` at once, with users first_user,
// first_user + 1, ...; their results in that order.
inline std::vector<ChatResult> post_siblings_at_once(const std::string& url,
                                                     const std::string& system,
                                                     uint64_t first_user) {
  std::vector<ChatResult> results(fan_out_requests);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < fan_out_requests; ++i) {
    clients.emplace_back([&, i] {
      results[i] = post_chat(url, chat(conversation(system, user_text(first_user + i))));
    });
  }
  for (std::thread& t : clients) t.join();
  return results;
}

// The same request as a reference: straight to llama-server, nothing cached.
inline ChatRequest reference(ChatRequest r) {
  r.cache_prompt = false;
  return r;
}

inline std::string describe(const ChatResult& r) {
  return "status=" + std::to_string(r.http.status) + " reuse=" + r.http.header("x-kvpark-reuse") +
         " restored=" + r.http.header("x-kvpark-restored-tokens") +
         " slot=" + r.http.header("x-kvpark-slot") +
         " prompt_tokens=" + std::to_string(r.prompt_tokens) +
         " cached_tokens=" + std::to_string(r.cached_tokens) +
         " prompt_n=" + std::to_string(r.prompt_n) + " cache_n=" + std::to_string(r.cache_n) +
         " content=\"" + r.content + "\" body=" + r.http.body.substr(0, 600);
}

// cached_tokens counts what no prefill on the request's behalf computed: the
// prompt less llama-server's prompt_n for the request, less a head the request led
// (prefilled for it just before; X-Kvpark-Prefilled-Tokens counts both, on answers
// that are not streamed).
inline int64_t expected_cached_tokens(const ChatResult& r) {
  const int64_t prefilled = r.header_int("x-kvpark-prefilled-tokens");
  return prefilled >= 0 ? r.prompt_tokens - prefilled : r.prompt_tokens - r.prompt_n;
}

inline std::string prompt_of(const std::string& apply_template_body) {
  rapidjson::Document doc;
  doc.Parse(apply_template_body.c_str());
  return !doc.HasParseError() && doc.IsObject() && doc.HasMember("prompt") &&
                 doc["prompt"].IsString()
             ? doc["prompt"].GetString()
             : "";
}

// The proxy's head for `system`: what renderings with two stand-in user turns share.
inline std::vector<int32_t> head_of(const std::string& server_url, const std::string& system,
                             std::vector<int32_t>* ret_rendered) {
  auto render = [&](const char* standin) {
    const ChatRequest r = chat(conversation(system, standin));
    const HttpResult prompt = http_post(server_url, "/apply-template", chat_request_json(r));
    std::vector<int32_t> tokens;
    tokenize(server_url, prompt_of(prompt.body), /*special=*/true, &tokens);
    return tokens;
  };
  *ret_rendered = render("a");
  const std::vector<int32_t> b = render("b");
  size_t head = 0;
  while (head < ret_rendered->size() && head < b.size() && (*ret_rendered)[head] == b[head]) ++head;
  return std::vector<int32_t>(ret_rendered->begin(), ret_rendered->begin() + ptrdiff_t(head));
}

// A number from a kvparkd's /v1/status (a bool as 0 or 1), -1 when absent.
inline int64_t daemon_status(const DaemonProcess& daemon, const char* key) {
  const HttpResult r =
      http_get("http://127.0.0.1:" + std::to_string(daemon.http_port()), "/v1/status");
  rapidjson::Document doc;
  doc.Parse(r.body.c_str());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember(key)) return -1;
  const auto& v = doc[key];
  if (v.IsBool()) return v.GetBool() ? 1 : 0;
  return v.IsUint64() ? int64_t(v.GetUint64()) : -1;
}

// The proxy's namespace `space_hex` (as /kvpark/status prints it), for a test client
// that reads or writes what the proxy parks there: snapshot-only (--park-as whole), or
// of blocks of block_tokens, block_bytes each (/kvpark/status says them).
inline kvpark_namespace proxy_namespace(const std::string& space_hex, const char* client_name,
                                        uint32_t block_tokens = 0, uint64_t block_bytes = 0) {
  Hash128 id;
  EXPECT_TRUE(parse_hex128(space_hex, id)) << space_hex;
  return {.id = {.low = id.low, .high = id.high},
          .block_tokens = block_tokens,
          .block_payload_bytes = block_bytes,
          .snapshot_required = block_tokens == 0 ? 1 : 0,
          .prefill_tokens_per_second = 0,
          .client_name = client_name};
}

// Parks, in the namespace `space_hex`, a snapshot after tokens[0, position) whose
// header is well formed but whose checksum does not match its bytes.
inline bool park_corrupt_snapshot(const std::string& socket, const std::string& space_hex,
                           const std::vector<int32_t>& tokens, size_t position) {
  const kvpark_namespace ns = proxy_namespace(space_hex, "corrupting-test");
  kvpark_client* client = nullptr;
  if (kvpark_connect(socket.c_str(), &ns, &client) != KVPARK_OK) return false;
  constexpr size_t file_bytes = 64 << 10;
  const kvpark_publish_options options{.session_id = 1,
                                       .entry_class = KVPARK_CLASS_SHARED,
                                       .evidence = KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
  kvpark_reservation* reservation = nullptr;
  bool ok = kvpark_reserve_snapshot(client, &options, tokens.data(), position,
                                    sizeof(SealedPayloadHeader) + file_bytes,
                                    &reservation) == KVPARK_OK;
  if (ok) {
    auto* payload = static_cast<uint8_t*>(kvpark_reservation_snapshot(reservation));
    std::memset(payload + sizeof(SealedPayloadHeader), 0x5a, file_bytes);
    sealed_payload_seal(payload, proxy::slot_file_magic, uint32_t(position), file_bytes);
    payload[sizeof(SealedPayloadHeader) + 100] ^= 0x01;  // after sealing: a bit flip
    ok = kvpark_seal(reservation) == KVPARK_OK;
  }
  kvpark_disconnect(client);
  return ok;
}

// A suite's scratch directory: made at the suite's set-up, removed at its tear-down
// (kept when KVPARK_KEEP_TEST_DIR is set); each test works in a folder of its own.
class SuiteDirectory {
 public:
  bool make(const std::string& prefix) {
    std::string templ = "/tmp/" + prefix + "-XXXXXX";
    const char* made = mkdtemp(templ.data());
    path_ = made != nullptr ? made : "";
    return made != nullptr;
  }
  void remove() {
    if (path_.empty()) return;
    if (std::getenv("KVPARK_KEEP_TEST_DIR") == nullptr) std::system(("rm -rf " + path_).c_str());
    path_.clear();
  }
  const std::string& path() const { return path_; }
  // The running test's folder, made on the first call.
  std::string test_folder() const {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');  // a parameterized test's "Name/param"
    const std::string folder = path_ + "/" + name;
    mkdir(folder.c_str(), 0755);
    return folder;
  }

 private:
  std::string path_;
};

class ProxyE2E : public ::testing::Test {
 protected:
  static bool available() {
    return executable("KVPARK_PROXY") && executable("KVPARK_LLAMA_SERVER") &&
           executable("KVPARK_MAKE_TEST_MODEL") && executable("KVPARKD");
  }
  static void SetUpTestSuite() {
    if (!available()) return;  // SetUp skips
    ASSERT_TRUE(suite_.make("kvpark-proxy-test"));
    ASSERT_TRUE(make_test_model(built_binary("KVPARK_MAKE_TEST_MODEL"), model_path()));
    // Heads of 32 dimensions: the only size here a q8_0 K cache (32-value blocks) takes.
    ASSERT_TRUE(make_test_model(built_binary("KVPARK_MAKE_TEST_MODEL"), wide_model_path(),
                                /*seed=*/1, /*embedding=*/128));
  }
  static void TearDownTestSuite() { suite_.remove(); }
  static std::string model_path() { return suite_.path() + "/model.gguf"; }
  static std::string wide_model_path() { return suite_.path() + "/model-wide.gguf"; }

  void SetUp() override {
    if (!available())
      GTEST_SKIP() << "needs KVPARK_PROXY, KVPARK_LLAMA_SERVER, KVPARK_MAKE_TEST_MODEL "
                      "(meson -Dllama=enabled -Dllama_server=PATH)";
    test_dir_ = suite_.test_folder();
    slot_dir_ = test_dir_ + "/slots";
    mkdir(slot_dir_.c_str(), 0755);
    ASSERT_TRUE(daemon_.start());
  }

  // The prefill rate kvparkd holds for the proxy's namespaces (the highest of those in
  // /v1/namespaces: only proxies connect here); -1 when there is none.
  int64_t kvparkd_proxy_prefill_rate() const {
    const HttpResult r =
        http_get("http://127.0.0.1:" + std::to_string(daemon_.http_port()), "/v1/namespaces");
    rapidjson::Document doc;
    if (r.status != 200 || doc.Parse(r.body.c_str()).HasParseError()) return -1;
    int64_t rate = -1;
    for (const auto& n : doc["namespaces"].GetArray())
      rate = std::max<int64_t>(rate, n["prefill_tokens_per_second"].GetUint());
    return rate;
  }

  void TearDown() override {
    // SIGTERM first: a proxy logs a request's line only after parking its turn.
    for (const auto& p : proxies_) p->stop();
    if (!HasFailure()) return;
    for (const auto& p : proxies_)
      std::fprintf(stderr, "--- %s (tail)\n%s\n", p->log_path().c_str(), p->log_tail().c_str());
    for (const auto& s : servers_)
      std::fprintf(stderr, "--- %s (tail)\n%s\n", s->log_path().c_str(), s->log_tail(2000).c_str());
  }

  LlamaServerProcess& start_server(std::vector<std::string> extra_args = {},
                                   std::string model = "") {
    return start_server_in(slot_dir_, std::move(extra_args), std::move(model));
  }

  // A llama-server whose --slot-save-path is `slot_dir` ("": none).
  LlamaServerProcess& start_server_in(const std::string& slot_dir,
                                      std::vector<std::string> extra_args = {},
                                      std::string model = "") {
    const std::string log = test_dir_ + "/llama-server-" + std::to_string(servers_.size()) + ".log";
    servers_.push_back(std::make_unique<LlamaServerProcess>(
        LlamaServerConfig{.binary = built_binary("KVPARK_LLAMA_SERVER"),
                          .model = model.empty() ? model_path() : model,
                          .slot_dir = slot_dir,
                          .extra_args = std::move(extra_args)},
        log));
    EXPECT_TRUE(servers_.back()->start()) << servers_.back()->log_tail();
    return *servers_.back();
  }

  // A proxy in front of `upstreams` (default: "m", the first server), started once
  // its stdout says `ready_line`.
  ProxyProcess& start_proxy(std::vector<ProxyUpstream> upstreams = {},
                            const std::string& ready_line = "kvpark-proxy: ready",
                            std::vector<std::string> extra_args = {}) {
    if (upstreams.empty()) upstreams.push_back({.name = "m", .url = servers_.at(0)->url()});
    const std::string log = test_dir_ + "/proxy-" + std::to_string(proxies_.size()) + ".log";
    proxies_.push_back(
        std::make_unique<ProxyProcess>(ProxyConfig{.binary = built_binary("KVPARK_PROXY"),
                                                   .upstreams = std::move(upstreams),
                                                   .slot_dir = slot_dir_,
                                                   .kvparkd_socket = daemon_.socket_path(),
                                                   .extra_args = std::move(extra_args),
                                                   .ready_line = ready_line},
                                       log));
    EXPECT_TRUE(proxies_.back()->start()) << proxies_.back()->log_tail();
    return *proxies_.back();
  }

  // Polls /kvpark/status until `publishes` reaches `count`: what the proxy parks after
  // a response may still be in flight when the client has it.
  static ProxyStatus wait_for_publishes(const ProxyProcess& proxy, int64_t count) {
    ProxyStatus status;
    (void)wait_until(
        [&] { return status = get_proxy_status(proxy.url()), status.publishes >= count; },
        publish_wait_msec_max);
    return status;
  }

  // Turn 1 through the proxy, then `restart`, then turn 2: the second turn must be
  // restored from kvparkd (private state at the end of turn 1), not prefilled.
  template <typename Restart>
  void expect_second_turn_restored(uint64_t seed, Restart restart) {
    LlamaServerProcess& server = *servers_.at(0);
    ProxyProcess& proxy = *proxies_.at(0);
    const std::string system = head_text(seed);
    std::vector<ChatMessage> messages = conversation(system, user_text(seed * 10));
    const ChatResult turn1 = post_chat(proxy.url(), chat(messages));
    ASSERT_EQ(turn1.http.status, 200) << describe(turn1);
    ASSERT_GT(turn1.prompt_tokens, 1000) << describe(turn1);
    const ProxyStatus published = wait_for_publishes(proxy, 2);  // the head and the turn
    EXPECT_GE(published.publishes, 2) << published.body;

    restart();
    if (HasFatalFailure()) return;

    messages.push_back({"assistant", turn1.content});
    messages.push_back({"user", user_text(seed * 10 + 1)});
    const int64_t before = prompt_tokens_total(server.url());
    const ChatResult turn2 = post_chat(proxy.url(), chat(messages));
    const int64_t prefilled = prompt_tokens_total(server.url()) - before;
    ASSERT_EQ(turn2.http.status, 200) << describe(turn2);
    const int64_t turn2_delta_max = turn2.prompt_tokens - turn1.prompt_tokens + token_slack;
    EXPECT_EQ(turn2.http.header("x-kvpark-reuse"), "private_turn_closure") << describe(turn2);
    EXPECT_GE(turn2.header_int("x-kvpark-restored-tokens"), turn1.prompt_tokens - token_slack)
        << describe(turn2);
    EXPECT_LE(turn2.prompt_n, turn2_delta_max) << describe(turn2);
    EXPECT_LE(prefilled, turn2_delta_max) << "llama-server prompt_tokens_total delta";
    EXPECT_EQ(turn2.cached_tokens, turn2.prompt_tokens - turn2.prompt_n) << describe(turn2);
    const ChatResult direct = post_chat(server.url(), reference(chat(messages)));
    ASSERT_EQ(direct.http.status, 200) << describe(direct);
    EXPECT_EQ(turn2.content, direct.content);
  }

  // After one refused restore of `system`'s state: a second sibling's restore is
  // refused too, which moves the upstream to a fresh namespace; the next sibling
  // parks the head there, and after a llama-server restart (nothing in any slot) a
  // last sibling restores it from kvparkd. Two refusals in all, never one per request.
  // (Restarts empty the slots, so the proxy restores rather than reusing a slot.)
  void expect_fresh_namespace_after_second_refusal(const std::string& system, uint64_t user,
                                                   const std::string& old_space) {
    LlamaServerProcess& server = *servers_.at(0);
    ProxyProcess& proxy = *proxies_.at(0);
    server.stop();
    ASSERT_TRUE(server.start()) << server.log_tail();
    const ChatResult second = post_chat(proxy.url(), chat(conversation(system, user_text(user))));
    ASSERT_EQ(second.http.status, 200) << describe(second);
    ProxyStatus status = get_proxy_status(proxy.url());
    EXPECT_EQ(status.restore_failures, 2) << status.body;
    ASSERT_EQ(status.upstreams.size(), 1u);
    EXPECT_NE(status.upstreams[0].space, old_space) << status.body;

    const int64_t publishes = status.publishes;
    const ChatResult third =
        post_chat(proxy.url(), chat(conversation(system, user_text(user + 1))));
    ASSERT_EQ(third.http.status, 200) << describe(third);
    wait_for_publishes(proxy, publishes + 2);  // the head and the turn, in the new namespace

    server.stop();
    ASSERT_TRUE(server.start()) << server.log_tail();
    const ChatRequest last = chat(conversation(system, user_text(user + 2)));
    const ChatResult restored = post_chat(proxy.url(), last);
    ASSERT_EQ(restored.http.status, 200) << describe(restored);
    EXPECT_EQ(restored.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(restored);
    EXPECT_GT(restored.header_int("x-kvpark-restored-tokens"), 1000) << describe(restored);
    status = get_proxy_status(proxy.url());
    EXPECT_EQ(status.restore_failures, 2) << status.body;
    const ChatResult direct = post_chat(server.url(), reference(last));
    EXPECT_EQ(restored.content, direct.content);
  }

  static inline SuiteDirectory suite_;
  std::string test_dir_;
  std::string slot_dir_;
  DaemonProcess daemon_{DaemonConfig{.arena_bytes = 256ull << 20,
                                     .extra_args = {"--http-listen", "127.0.0.1:0"}}};
  std::vector<std::unique_ptr<LlamaServerProcess>> servers_;
  std::vector<std::unique_ptr<ProxyProcess>> proxies_;  // destroyed before the servers
};

}  // namespace kvpark::testing
