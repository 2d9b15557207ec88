// kvpark-proxy-bench --capacity: what kvparkd's arena holds for sibling conversations
// over one head, parked as blocks (proxy/state_blocks.h) and as whole slot files.
//
// N conversations share a system head; each runs T turns (every turn's prompt holds
// the conversation so far). For each way of parking, in one run on one llama-server:
// a fresh kvparkd, a proxy with --park-as, the same requests; then kvparkd's
// arena_used_bytes, its entries, and the bytes of the unique tokens (the head once,
// plus every conversation's own turns and replies) at the upstream's KV bytes per
// token (from the blocks proxy's /kvpark/status).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <rapidjson/document.h>

#include "bench/proxy/restore_bench.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/llama_server_process.h"
#include "tests/testing/openai_http.h"
#include "tests/testing/wait.h"

using namespace kvpark::testing;

namespace kvpark::bench {
namespace {

constexpr int publish_wait_msec_max = 300'000;
constexpr size_t user_words = 60;  // a turn's own text: ~240 tokens

struct Parked {
  int64_t arena_used_bytes = -1;
  int64_t blocks = -1, snapshots = -1;
  int64_t unique_tokens = 0;  // the head once, and every conversation's own tokens
  int64_t token_bytes = 0;    // KV bytes per token, from the proxy (blocks only)
  int64_t publishes = 0;
};

int64_t status_number(const rapidjson::Document& doc, const char* key) {
  return doc.HasMember(key) && doc[key].IsUint64() ? int64_t(doc[key].GetUint64()) : -1;
}

bool park_conversations(const RestorePathOptions& o, LlamaServerProcess& server,
                        const std::string& park_as, const std::string& head, int64_t head_tokens,
                        int conversations, int turns, const std::string& work, Parked* ret) {
  DaemonProcess daemon(DaemonConfig{.arena_bytes = o.arena_bytes,
                                    .extra_args = {"--http-listen", "127.0.0.1:0"}});
  if (!daemon.start()) {
    std::fprintf(stderr, "kvparkd did not start: %s\n", daemon.log_tail().c_str());
    return false;
  }
  ProxyProcess proxy(ProxyConfig{.binary = o.proxy,
                                 .upstreams = {{.name = "m", .url = server.url()}},
                                 .slot_dir = server.config().slot_dir,
                                 .kvparkd_socket = daemon.socket_path(),
                                 .extra_args = {"--park-as", park_as}},
                     work + "/proxy-capacity-" + park_as + ".log");
  if (!proxy.start()) {
    std::fprintf(stderr, "kvpark-proxy did not start: %s\n", proxy.log_tail().c_str());
    return false;
  }
  ret->unique_tokens = head_tokens;
  for (int c = 0; c < conversations; ++c) {
    ChatRequest r;
    r.model = "m";
    r.max_tokens = 32;
    r.messages = {{"system", head}};
    int64_t own = 0;
    for (int t = 0; t < turns; ++t) {
      r.messages.push_back(
          {"user", "Question " + std::to_string(c * 100 + t) + ":" +
                       english_text(user_words, 9000 + uint64_t(c * 100 + t)) + "?"});
      const ChatResult result = post_chat(proxy.url(), r);
      if (result.http.status != 200) {
        std::fprintf(stderr, "request failed: %d %s\n", result.http.status,
                     result.http.body.substr(0, 300).c_str());
        return false;
      }
      r.messages.push_back({"assistant", result.content});
      // This turn's prompt past the head, and (at most max_tokens) its reply.
      own = result.prompt_tokens - head_tokens + int64_t(r.max_tokens);
    }
    ret->unique_tokens += own;
  }
  // Every turn's closure and the head, parked in the background.
  const int64_t expected = 1 + int64_t(conversations) * turns;
  (void)wait_until([&] { return get_proxy_status(proxy.url()).publishes >= expected; },
                   publish_wait_msec_max);
  const ProxyStatus status = get_proxy_status(proxy.url());
  ret->publishes = status.publishes;
  if (!status.upstreams.empty() && status.upstreams[0].block_tokens > 0)
    ret->token_bytes = status.upstreams[0].block_bytes / status.upstreams[0].block_tokens;
  const HttpResult s =
      http_get("http://127.0.0.1:" + std::to_string(daemon.http_port()), "/v1/status");
  rapidjson::Document doc;
  if (s.status != 200 || doc.Parse(s.body.c_str()).HasParseError() || !doc.IsObject()) {
    std::fprintf(stderr, "kvparkd's /v1/status: %d %s\n", s.status, s.body.substr(0, 200).c_str());
    return false;
  }
  ret->arena_used_bytes = status_number(doc, "arena_used_bytes");
  ret->blocks = status_number(doc, "blocks");
  ret->snapshots = status_number(doc, "snapshots");
  proxy.stop();
  return ret->arena_used_bytes > 0;
}

}  // namespace

bool run_capacity(const RestorePathOptions& o, int conversations, int turns,
                  const std::string& work) {
  const std::string model = work + "/model-capacity.gguf";
  std::string out;
  if (run_process({o.make_test_model, model, "--seed", "1", "--text-only-output", "1",
                   "--layers", std::to_string(o.layers), "--embedding",
                   std::to_string(o.embedding)},
                  120'000, &out) != 0) {
    std::fprintf(stderr, "cannot make the model: %s\n", out.c_str());
    return false;
  }
  const std::string slots = work + "/slots-capacity";
  std::filesystem::create_directories(slots);
  const int per_slot = int((o.head_tokens + size_t(turns) * 400 + 1024 + 255) / 256 * 256);
  LlamaServerProcess server(LlamaServerConfig{.binary = o.llama_server,
                                              .model = model,
                                              .slot_dir = slots,
                                              .slots = 2,
                                              .context_tokens = per_slot * 2,
                                              .threads = o.threads},
                            work + "/llama-server-capacity.log");
  if (!server.start()) {
    std::fprintf(stderr, "llama-server did not start: %s\n", server.log_tail().c_str());
    return false;
  }
  const std::string head = english_text(o.head_tokens / 4, 13);
  const int64_t head_tokens = count_tokens(server.url(), head);
  Parked blocks, whole;
  // A restart between: nothing either proxy parks comes from the other's slots.
  bool ok = park_conversations(o, server, "blocks", head, head_tokens, conversations, turns, work,
                               &blocks);
  server.stop();
  ok = ok && server.start() &&
       park_conversations(o, server, "whole", head, head_tokens, conversations, turns, work,
                          &whole);
  if (!ok || blocks.token_bytes <= 0) return false;
  const double unique = double(blocks.unique_tokens) * double(blocks.token_bytes);
  std::printf(
      "\nkvpark-proxy-bench --capacity: test model --layers %d --embedding %d (%.1f KB of state "
      "per token), head %lld tokens, %d conversations x %d turns\n\n",
      o.layers, o.embedding, double(blocks.token_bytes) / 1e3,
      static_cast<long long>(head_tokens), conversations, turns);
  std::printf("| parked as | entries (blocks + snapshots) | publishes | arena bytes | unique "
              "state (head once + own tokens) | ratio |\n|---|---:|---:|---:|---:|---:|\n");
  for (const auto& [name, p] : {std::pair{"whole slot files", &whole}, {"blocks", &blocks}}) {
    std::printf("| %s | %lld + %lld | %lld | %.1f MB | %.1f MB | %.2fx |\n", name,
                static_cast<long long>(p->blocks), static_cast<long long>(p->snapshots),
                static_cast<long long>(p->publishes), double(p->arena_used_bytes) / 1e6,
                unique / 1e6, double(p->arena_used_bytes) / unique);
  }
  std::printf("\nblocks / whole arena bytes: %.2f; blocks / unique state: %.2f (goal <= 1.15)\n",
              double(blocks.arena_used_bytes) / double(whole.arena_used_bytes),
              double(blocks.arena_used_bytes) / unique);
  return true;
}

}  // namespace kvpark::bench
