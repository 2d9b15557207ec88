// The remote tier for kvpark-proxy in front of llama-server, end to end: two stacks
// on one machine stand for hosts A and B, each its own kvparkd (own arena and
// socket, no disk tier), its own llama-server (own slot directory) and its own
// kvpark-proxy, and both kvparkd write to and read from one redis-server. A head A's
// proxy parked reaches B through the store: B's sibling of it is served with the
// head restored from the remote tier, not prefilled, and answers what a fresh
// prefill answers (greedy decoding). With the store gone, B prefills and answers the
// same. What was prefilled is read from llama-server (prompt_n, prompt_tokens_total),
// what came from the store from B's kvparkd (/v1/status).
//
// The proxy's head snapshot is a shared entry (the write plan classes positions
// inside the leading system/tools run as shared), so `remote_write = shared` writes
// it; the turn's closure is private and stays on A (asserted below).
#include <cstdio>
#include <sstream>

#include "tests/proxy/proxy_e2e.h"
#include "tests/testing/eventually.h"
#include "tests/testing/redis_process.h"

namespace kvpark::testing {
namespace {

// Enough for the test model's slot files (a few MiB a head).
constexpr uint64_t stack_arena_bytes = 256ull << 20;

// One host: kvparkd over the store at `remote` ("": no remote tier), llama-server,
// kvpark-proxy in front of it.
struct Stack {
  std::string slot_dir;
  std::unique_ptr<DaemonProcess> daemon;
  std::unique_ptr<LlamaServerProcess> server;
  std::unique_ptr<ProxyProcess> proxy;

  std::string dump() const {
    return "--- kvparkd " + daemon->log_path() + " (tail)\n" + daemon->log_tail() + "\n--- " +
           proxy->log_path() + " (tail)\n" + proxy->log_tail() + "\n--- " + server->log_path() +
           " (tail)\n" + server->log_tail(2000) + "\n";
  }
};

// The store's snapshot manifests: keys "...}:s<position>.<tail digest>" (no chunk
// suffix, not an index).
size_t snapshot_manifests(const RedisProcess& redis) {
  std::istringstream lines(redis.cli({"KEYS", "kvpark:r1:*"}));
  size_t n = 0;
  for (std::string key; std::getline(lines, key);) {
    const size_t s = key.find("}:s");
    if (s == std::string::npos) continue;
    const std::string tail = key.substr(s + 3);
    if (!tail.empty() && tail.find(':') == std::string::npos) ++n;
  }
  return n;
}

// Parked as blocks (the default; the store holds the head's whole blocks and the tail
// snapshot past them, and B restores the head to its exact end) or as whole slot files
// (one shared snapshot).
class ProxyRemoteE2E : public ::testing::TestWithParam<const char*> {
 protected:
  static bool available() {
    return executable("KVPARK_PROXY") && executable("KVPARK_LLAMA_SERVER") &&
           executable("KVPARK_MAKE_TEST_MODEL") && executable("KVPARKD") &&
           !redis_server_path().empty();
  }
  static void SetUpTestSuite() {
    if (!available()) return;  // SetUp skips
    ASSERT_TRUE(suite_.make("kvpark-proxy-remote-test"));
    ASSERT_TRUE(make_test_model(built_binary("KVPARK_MAKE_TEST_MODEL"), model_path()));
  }
  static void TearDownTestSuite() { suite_.remove(); }
  static std::string model_path() { return suite_.path() + "/model.gguf"; }

  void SetUp() override {
    if (!available())
      GTEST_SKIP() << "needs redis-server and KVPARK_PROXY, KVPARK_LLAMA_SERVER, "
                      "KVPARK_MAKE_TEST_MODEL (meson -Dllama=enabled -Dllama_server=PATH)";
    test_dir_ = suite_.test_folder();
    ASSERT_TRUE(redis_.start()) << redis_.log_tail();
    const std::string remote = "redis://" + redis_.address();
    start_stack(a_, "a", remote);
    start_stack(b_, "b", remote);
    if (HasFatalFailure()) return;
    // One model, one llama-server configuration: one namespace on both hosts, so
    // A's keys are B's.
    const ProxyStatus sa = get_proxy_status(a_.proxy->url());
    const ProxyStatus sb = get_proxy_status(b_.proxy->url());
    ASSERT_EQ(sa.upstreams.size(), 1u) << sa.body;
    ASSERT_EQ(sb.upstreams.size(), 1u) << sb.body;
    ASSERT_EQ(sa.upstreams[0].space, sb.upstreams[0].space);
  }

  void TearDown() override {
    for (Stack* s : {&a_, &b_}) {
      if (s->proxy) s->proxy->stop();  // a proxy logs a request after parking its turn
    }
    if (!HasFailure()) return;
    for (Stack* s : {&a_, &b_}) {
      if (s->daemon && s->proxy && s->server) std::fprintf(stderr, "%s", s->dump().c_str());
    }
    std::fprintf(stderr, "--- redis-server (tail)\n%s\n", redis_.log_tail().c_str());
  }

  void start_stack(Stack& s, const std::string& name, const std::string& remote) {
    s.slot_dir = test_dir_ + "/slots-" + name;
    mkdir(s.slot_dir.c_str(), 0755);
    std::vector<std::string> args = {"--http-listen", "127.0.0.1:0"};
    if (!remote.empty()) args.insert(args.end(), {"--remote", remote, "--remote-write", "shared"});
    s.daemon = std::make_unique<DaemonProcess>(DaemonConfig{
        .arena_bytes = stack_arena_bytes, .extra_args = args, .label = "proxy-remote-" + name});
    ASSERT_TRUE(s.daemon->start()) << s.daemon->log_tail();
    s.server = std::make_unique<LlamaServerProcess>(
        LlamaServerConfig{.binary = built_binary("KVPARK_LLAMA_SERVER"),
                          .model = model_path(),
                          .slot_dir = s.slot_dir},
        test_dir_ + "/llama-server-" + name + ".log");
    ASSERT_TRUE(s.server->start()) << s.server->log_tail();
    s.proxy = std::make_unique<ProxyProcess>(
        ProxyConfig{.binary = built_binary("KVPARK_PROXY"),
                    .upstreams = {{.name = "m", .url = s.server->url()}},
                    .slot_dir = s.slot_dir,
                    .kvparkd_socket = s.daemon->socket_path(),
                    .extra_args = {"--park-as", GetParam()}},
        test_dir_ + "/proxy-" + name + ".log");
    ASSERT_TRUE(s.proxy->start()) << s.proxy->log_tail();
  }

  bool blocks() const { return std::string(GetParam()) == "blocks"; }

  int64_t proxy_head_tokens(const std::string& system) {
    std::vector<int32_t> rendered;
    return int64_t(head_of(b_.server->url(), system, &rendered).size());
  }
  // What A writes behind of the head: its snapshot, or its whole blocks and the tail
  // snapshot past them.
  int64_t head_writes(const std::string& system) {
    const int64_t head = proxy_head_tokens(system);
    return blocks() ? head / 64 + (head % 64 != 0 ? 1 : 0) : 1;
  }
  size_t head_snapshots(const std::string& system) {
    return !blocks() || proxy_head_tokens(system) % 64 != 0 ? 1 : 0;
  }

  // A request with `system`'s head through A's proxy; returns once the store holds
  // what A wrote behind of the head (and only that: the turn is private): its
  // snapshot, or its whole blocks and its tail.
  ChatResult park_head_on_a(const std::string& system, uint64_t user) {
    const ChatResult a = post_chat(a_.proxy->url(), chat(conversation(system, user_text(user))));
    EXPECT_EQ(a.http.status, 200) << describe(a);
    (void)wait_until([&] { return get_proxy_status(a_.proxy->url()).publishes >= 2; },
                     publish_wait_msec_max);  // the head and the turn
    const int64_t writes = head_writes(system);
    EXPECT_TRUE(eventually("A wrote the head to the store", [&] {
      return daemon_status(*a_.daemon, "remote_writes") >= writes &&
             snapshot_manifests(redis_) >= head_snapshots(system);
    }));
    EXPECT_EQ(get_proxy_status(a_.proxy->url()).publishes, 2);
    EXPECT_EQ(daemon_status(*a_.daemon, "remote_writes"), writes)
        << "the private turn is not written";
    EXPECT_EQ(snapshot_manifests(redis_), head_snapshots(system));
    return a;
  }

  static inline SuiteDirectory suite_;
  std::string test_dir_;
  RedisProcess redis_;
  Stack a_;  // destroyed before redis_: proxies, servers, then daemons
  Stack b_;
};

TEST_P(ProxyRemoteE2E, ASiblingOnBIsServedWithTheHeadAParkedRestoredFromTheStore) {
  const std::string system = head_text(41);
  const int64_t head_tokens = count_tokens(b_.server->url(), system);
  ASSERT_GT(head_tokens, 1000);
  const ChatResult a = park_head_on_a(system, 1);
  ASSERT_FALSE(HasFailure());

  const ChatRequest sibling = chat(conversation(system, user_text(2)));
  const int64_t before = prompt_tokens_total(b_.server->url());
  const ChatResult b = post_chat(b_.proxy->url(), sibling);
  const int64_t prefilled = prompt_tokens_total(b_.server->url()) - before;
  ASSERT_EQ(b.http.status, 200) << describe(b);
  // The head to its exact end: as blocks, its whole blocks and the tail snapshot that
  // continues them, both from the store.
  const int64_t restorable = proxy_head_tokens(system);
  const int64_t b_delta_max = b.prompt_tokens - std::min(head_tokens, restorable) + token_slack;
  EXPECT_EQ(b.http.header("x-kvpark-reuse"), "shared_stable_prefix") << describe(b);
  EXPECT_EQ(b.header_int("x-kvpark-restored-tokens"), restorable) << describe(b);
  EXPECT_GE(b.cached_tokens, std::min(head_tokens, restorable)) << describe(b);
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  EXPECT_LE(b.prompt_n, b_delta_max) << describe(b);
  EXPECT_LE(prefilled, b_delta_max) << "llama-server prompt_tokens_total delta over B";
  const ProxyStatus status = get_proxy_status(b_.proxy->url());
  EXPECT_EQ(status.head_prefills, 0) << status.body;
  EXPECT_EQ(status.restore_failures, 0) << status.body;
  // It came from the store: B's kvparkd promoted the head's snapshot, or its blocks and
  // tail, from the remote tier, every check passed.
  EXPECT_EQ(daemon_status(*b_.daemon, "remote_hits"), head_writes(system));
  EXPECT_GT(daemon_status(*b_.daemon, "remote_bytes_in"), 0);
  EXPECT_EQ(daemon_status(*b_.daemon, "remote_corrupt"), 0);
  EXPECT_EQ(daemon_status(*b_.daemon, "remote_rejected"), 0);

  const ChatResult direct = post_chat(b_.server->url(), reference(sibling));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(b.content, direct.content);
  EXPECT_EQ(b.finish_reason, direct.finish_reason);
  std::printf(
      "figures: head %lld tokens; A (head prefilled) %.0f ms; B (head from the store) %.0f ms, "
      "cached_tokens %lld of %lld, prompt_n %lld, remote_bytes_in %lld, "
      "remote_get_usec_mean %lld, remote_probe_usec_mean %lld; B's fresh prefill (reference) "
      "%.0f ms\n",
      (long long)head_tokens, a.total_msec, b.total_msec, (long long)b.cached_tokens,
      (long long)b.prompt_tokens, (long long)b.prompt_n,
      (long long)daemon_status(*b_.daemon, "remote_bytes_in"),
      (long long)daemon_status(*b_.daemon, "remote_get_usec_mean"),
      (long long)daemon_status(*b_.daemon, "remote_probe_usec_mean"), direct.total_msec);
}

TEST_P(ProxyRemoteE2E, WithTheStoreGoneBPrefillsTheSiblingAndAnswersTheSame) {
  const std::string system = head_text(42);
  ASSERT_GT(count_tokens(b_.server->url(), system), 1000);
  park_head_on_a(system, 3);
  ASSERT_FALSE(HasFailure());
  redis_.kill_hard();

  const ChatRequest sibling = chat(conversation(system, user_text(4)));
  const int64_t before = prompt_tokens_total(b_.server->url());
  const ChatResult b = post_chat(b_.proxy->url(), sibling);
  const int64_t prefilled = prompt_tokens_total(b_.server->url()) - before;
  ASSERT_EQ(b.http.status, 200) << describe(b);
  EXPECT_EQ(b.cached_tokens, 0) << describe(b);
  EXPECT_EQ(b.cached_tokens, expected_cached_tokens(b)) << describe(b);
  EXPECT_GE(prefilled, b.prompt_tokens - token_slack) << "the whole prompt prefilled on B";
  const ProxyStatus status = get_proxy_status(b_.proxy->url());
  EXPECT_EQ(status.head_prefills, 1) << status.body;
  EXPECT_TRUE(status.kvparkd_connected) << status.body;  // B's kvparkd serves on
  EXPECT_EQ(status.restore_failures, 0) << status.body;
  EXPECT_EQ(daemon_status(*b_.daemon, "remote_hits"), 0);
  // B's lookup asked the store and found it gone.
  EXPECT_TRUE(eventually("B's remote tier is down",
                         [&] { return daemon_status(*b_.daemon, "remote_up") == 0; }));

  const ChatResult direct = post_chat(b_.server->url(), reference(sibling));
  ASSERT_EQ(direct.http.status, 200) << describe(direct);
  EXPECT_EQ(b.content, direct.content);
  EXPECT_EQ(b.finish_reason, direct.finish_reason);
  std::printf(
      "figures: store down: B cached_tokens %lld of %lld, prefilled %lld, %.0f ms; "
      "fresh prefill (reference) %.0f ms\n",
      (long long)b.cached_tokens, (long long)b.prompt_tokens, (long long)prefilled, b.total_msec,
      direct.total_msec);
}

INSTANTIATE_TEST_SUITE_P(ParkedAs, ProxyRemoteE2E, ::testing::Values("blocks", "whole"),
                         [](const auto& param_info) { return std::string(param_info.param); });

}  // namespace
}  // namespace kvpark::testing
