// kvpark-proxy-bench: time to first token and tokens prefilled through kvpark-proxy
// versus straight to llama-server, on the project's random-weight test model (CPU).
//
//   kvpark-proxy-bench [--quick] [--head-tokens N] [--llama-server PATH] [--proxy PATH]
//                      [--kvparkd PATH] [--model PATH | --make-test-model PATH]
//                      [--arch ARCH [--layers N] [--embedding N]]
//                      [--slots N] [--threads N] [--fan-out N] [--api LIST] [--keep]
//   kvpark-proxy-bench --restore-path [--head-tokens N] [--layers N] [--embedding N]
//   kvpark-proxy-bench --overhead [--head-tokens N] [--pairs N]
//
// --restore-path runs only the realistic-geometry case of restore_bench.cpp (a
// 4096-token head by default on a model of ~65 KB of state per token).
//
// --overhead runs only the same-server sibling: one llama-server, a 12288-token head
// by default; siblings (max_tokens 1, not streamed) sent straight to it and through
// the proxy in turn (the order alternating pair by pair), whole-request latency
// client side; the paired differences' median, and the proxy's own time before
// forwarding (X-Kvpark-Forward-Ms) per request.
//
// Cases, for each wire format of --api (chat, responses, messages: all three by
// default; requests shaped as tests/testing/agent_http.h has them), each run once
// direct and once through the proxy, each on a fresh llama-server (new process, empty
// cache) and, for the proxy, a fresh kvparkd:
//   sibling    request A (system head + user 1), then B (same head, user 2); B measured
//   fan-out    N siblings at once; max and median TTFT, all prefill together
//   restart    turn 1, llama-server restarted, turn 2 (turn 1 + reply + user 2) measured
// TTFT is client side: request sent -> first streamed content delta. Tokens
// prefilled: llama-server's llamacpp:prompt_tokens_total over the measured requests,
// with what their usage said was not cached (prompt less cached) beside it. Through
// the proxy, a measured request starts once the proxy has parked what the previous one
// left (as a later client would find it). Exit status: 0 when every request succeeded,
// 1 otherwise, 2 on a bad flag.
#include <getopt.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/proxy/restore_bench.h"
#include "tests/testing/agent_http.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/llama_server_process.h"
#include "tests/testing/openai_http.h"
#include "tests/testing/wait.h"
#include "proto/version.h"

using namespace kvpark::testing;

namespace {

constexpr size_t head_tokens_default = 8192;
constexpr size_t head_tokens_quick = 1024;
constexpr int context_margin_tokens = 1024;  // per slot, past the head: users, replies
constexpr int publish_wait_msec_max = 30'000;

struct Options {
  std::string llama_server = KVPARK_BENCH_LLAMA_SERVER;
  std::string proxy = KVPARK_BENCH_PROXY;
  std::string kvparkd = KVPARK_BENCH_KVPARKD;
  std::string make_test_model = KVPARK_BENCH_MAKE_TEST_MODEL;
  std::string model;  // "": made with make_test_model
  size_t head_tokens = head_tokens_default;
  int slots = 4;
  int threads = 2;
  int fan_out = 6;
  bool keep = false;  // keep the work directory (logs)
  bool restore_path = false;
  bool overhead = false;
  bool capacity = false;
  int conversations = 4;
  int turns = 2;
  int pairs = 15;
  bool head_given = false;
  int layers = 32;
  int embedding = 1024;
  std::string arch;  // the test model's family; with it, --layers/--embedding if given
  bool geometry_given = false;
  std::vector<WireFormat> apis = {WireFormat::chat, WireFormat::responses, WireFormat::messages};
};

struct Figures {
  std::vector<double> ttft_msec;  // one per measured request
  int64_t prefilled = 0;          // prompt_tokens_total delta
  int64_t prompt_n = 0;           // sum of what usage said was not cached
  bool usage_missing = false;     // some answer's usage had no prompt figures
  std::string notes;              // proxy headers of the measured requests
};

struct Row {
  std::string api;
  std::string name;
  Figures direct, proxy;
};


std::string user_text(int n) {
  return "Question " + std::to_string(n) + ":" + english_text(30, 5000 + uint64_t(n)) + "?";
}

class Bench {
 public:
  Bench(Options options, std::string work_dir)
      : o_(std::move(options)), work_(std::move(work_dir)), slots_(work_ + "/slots") {}
  ~Bench() {
    if (proxy_ != nullptr) proxy_->stop();  // SIGTERM: it logs its last requests
  }

  bool setup() {
    std::filesystem::create_directories(slots_);
    if (o_.model.empty()) {
      o_.model = work_ + "/model.gguf";
      std::vector<std::string> argv = {o_.make_test_model, o_.model, "--text-only-output", "1"};
      if (!o_.arch.empty()) argv.insert(argv.end(), {"--arch", o_.arch});
      if (o_.geometry_given)
        argv.insert(argv.end(), {"--layers", std::to_string(o_.layers), "--embedding",
                                 std::to_string(o_.embedding)});
      std::string out;
      if (run_process(argv, 120'000, &out) != 0) return fail("cannot make the model: " + out);
    }
    const int per_slot = int((o_.head_tokens + context_margin_tokens + 255) / 256 * 256);
    server_ = std::make_unique<LlamaServerProcess>(
        LlamaServerConfig{.binary = o_.llama_server,
                          .model = o_.model,
                          .slot_dir = slots_,
                          .slots = o_.slots,
                          .context_tokens = per_slot * o_.slots,
                          .threads = o_.threads},
        work_ + "/llama-server.log");
    if (!server_->start()) return fail("llama-server did not start: " + server_->log_tail());
    return calibrate_head();
  }

  // One case, direct then through the proxy, each from a fresh start.
  template <typename Case>
  bool run(const std::string& name, Case measure) {
    Row row{.api = wire_format_string(format_), .name = name};
    if (!fresh(/*proxied=*/false) || !measure(server_->url(), &row.direct)) return false;
    if (!fresh(/*proxied=*/true) || !measure(proxy_->url(), &row.proxy)) return false;
    rows_.push_back(row);
    return true;
  }

  bool sibling(const std::string& url, Figures* ret) {
    const int64_t before = publishes(url);
    AgentResult a;
    if (!stream(url, {{"system", head_}, {"user", user_text(1)}}, &a)) return false;
    settle(url, before);
    return measure(url, {{{"system", head_}, {"user", user_text(2)}}}, ret);
  }

  // Sibling B reaches a llama-server process that never saw A (restarted, or
  // another process of the same model): only parked state can serve its head.
  bool sibling_after_restart(const std::string& url, Figures* ret) {
    const int64_t before = publishes(url);
    AgentResult a;
    if (!stream(url, {{"system", head_}, {"user", user_text(3)}}, &a)) return false;
    settle(url, before);
    server_->stop();
    if (!server_->start()) return fail("llama-server did not restart: " + server_->log_tail());
    warm_up();
    return measure(url, {{{"system", head_}, {"user", user_text(4)}}}, ret);
  }

  bool fan_out(const std::string& url, Figures* ret) {
    std::vector<std::vector<ChatMessage>> requests;
    for (int i = 0; i < o_.fan_out; ++i)
      requests.push_back({{"system", head_}, {"user", user_text(10 + i)}});
    return measure(url, requests, ret);
  }

  bool restart(const std::string& url, Figures* ret) {
    std::vector<ChatMessage> messages = {{"system", head_}, {"user", user_text(20)}};
    const int64_t before = publishes(url);
    AgentResult turn1;
    if (!stream(url, messages, &turn1)) return false;
    settle(url, before);
    server_->stop();
    if (!server_->start()) return fail("llama-server did not restart: " + server_->log_tail());
    warm_up();
    messages.push_back({"assistant", turn1.content});
    messages.push_back({"user", user_text(21)});
    return measure(url, {messages}, ret);
  }

  // Same-server siblings, direct and through the proxy in turn.
  bool overhead() {
    if (!fresh(/*proxied=*/true)) return false;
    const int64_t before = publishes(proxy_->url());
    AgentResult a;
    if (!stream(proxy_->url(), {{"system", head_}, {"user", user_text(1)}}, &a)) return false;
    settle(proxy_->url(), before + 1);  // the head (parked in the background) and the turn
    std::vector<double> direct, proxied, paired, forward_msec;
    int known_prefix = 0;
    for (int i = 0; i < o_.pairs + 1; ++i) {  // the first pair warms both paths, not counted
      double ms[2] = {0, 0};
      for (int k = 0; k < 2; ++k) {
        const bool via_proxy = (k == 0) == (i % 2 == 1);
        ChatRequest r;
        r.model = "m";
        r.messages = {{"system", head_}, {"user", user_text(100 + 2 * i + (via_proxy ? 1 : 0))}};
        r.max_tokens = 1;
        const int64_t published = via_proxy ? publishes(proxy_->url()) : 0;
        const ChatResult result = post_chat(via_proxy ? proxy_->url() : server_->url(), r);
        if (result.http.status != 200) return fail("status " + std::to_string(result.http.status));
        ms[via_proxy ? 1 : 0] = result.total_msec;
        if (via_proxy) {
          settle(proxy_->url(), published);  // its work after the response is not the next one's
          if (i == 0) continue;
          forward_msec.push_back(std::strtod(result.http.header("x-kvpark-forward-ms").c_str(), nullptr));
          known_prefix += result.http.header("x-kvpark-forward-path") == "known_prefix";
        }
      }
      if (i == 0) continue;
      direct.push_back(ms[0]);
      proxied.push_back(ms[1]);
      paired.push_back(ms[1] - ms[0]);
    }
    std::printf(
        "\nkvpark-proxy-bench --overhead: head %zu tokens (measured %lld), %d pairs, %d slots, "
        "%d threads\n\n| | p50 ms | min ms | max ms |\n|---|---:|---:|---:|\n",
        o_.head_tokens, static_cast<long long>(head_measured_), o_.pairs, o_.slots, o_.threads);
    auto row = [](const char* name, const std::vector<double>& v) {
      std::printf("| %s | %.2f | %.2f | %.2f |\n", name, median_of(v),
                  *std::min_element(v.begin(), v.end()), max_of(v));
    };
    row("direct, whole request", direct);
    row("through the proxy, whole request", proxied);
    row("paired difference (proxy - direct)", paired);
    row("proxy's time before forwarding", forward_msec);
    std::printf(
        "\nForwarded on a known prefix (no upstream call before forwarding): %d of %d (the "
        "others: a direct request had taken the slot the proxy counted on)\n",
        known_prefix, o_.pairs);
    return true;
  }

  void print() const {
    std::printf(
        "\nkvpark-proxy-bench: head %zu tokens (measured %lld), %d slots, %d threads, "
        "model %s\n\n",
        o_.head_tokens, static_cast<long long>(head_measured_), o_.slots, o_.threads,
        o_.arch.empty() ? o_.model.c_str() : o_.arch.c_str());
    std::printf(
        "| api | case | direct TTFT ms | proxy TTFT ms | direct tokens prefilled | "
        "proxy tokens prefilled |\n|---|---|---:|---:|---:|---:|\n");
    for (const Row& r : rows_) {
      std::printf("| %s | %s | %s | %s | %s | %s |\n", r.api.c_str(), r.name.c_str(),
                  ttft_cell(r.direct).c_str(),
                  ttft_cell(r.proxy).c_str(), prefill_cell(r.direct).c_str(),
                  prefill_cell(r.proxy).c_str());
    }
    std::printf(
        "\nTTFT: client side, request sent to first content delta (fan-out: max / "
        "median). Prefilled: llama-server prompt_tokens_total delta (what usage said was "
        "not cached: prompt less cached).\n\nProxy responses:\n");
    for (const Row& r : rows_)
      std::printf("  %s, %s:%s\n", r.api.c_str(), r.name.c_str(), r.proxy.notes.c_str());
  }

 private:
  bool fail(const std::string& why) {
    std::fprintf(stderr, "kvpark-proxy-bench: %s\n", why.c_str());
    return false;
  }

  // A head of about o_.head_tokens tokens, as llama-server tokenizes it.
  bool calibrate_head() {
    size_t words = o_.head_tokens / 4;  // about 4 tokens a word (few whole-word pieces)
    for (int round = 0; round < 4; ++round) {
      head_ = english_text(words, 7);
      head_measured_ = count_tokens(server_->url(), head_);
      if (head_measured_ <= 0) return fail("POST /tokenize failed");
      if (head_measured_ <= int64_t(o_.head_tokens) &&
          head_measured_ > int64_t(o_.head_tokens) * 98 / 100)
        return true;
      words = words * o_.head_tokens * 99 / 100 / size_t(head_measured_);
    }
    return true;
  }

  // A fresh llama-server; for the proxy also a fresh kvparkd, slot directory and proxy.
  bool fresh(bool proxied) {
    if (proxy_ != nullptr) proxy_->stop();  // SIGTERM: it logs its last requests
    proxy_.reset();
    server_->stop();
    std::filesystem::remove_all(slots_);
    std::filesystem::create_directories(slots_);
    if (!server_->start()) return fail("llama-server did not start: " + server_->log_tail());
    warm_up();
    if (!proxied) return true;
    daemon_ = std::make_unique<DaemonProcess>(DaemonConfig{.arena_bytes = 1ull << 30});
    if (!daemon_->start()) return fail("kvparkd did not start: " + daemon_->log_path());
    proxy_ = std::make_unique<ProxyProcess>(
        ProxyConfig{.binary = o_.proxy,
                    .upstreams = {{.name = "m", .url = server_->url()}},
                    .slot_dir = slots_,
                    .kvparkd_socket = daemon_->socket_path()},
        work_ + "/proxy.log");
    if (!proxy_->start()) return fail("kvpark-proxy did not start: " + proxy_->log_tail());
    return true;
  }

  // A one-token request straight to llama-server: first-request costs out of the way.
  void warm_up() {
    ChatRequest r;
    r.messages = {{"user", "hi"}};
    r.max_tokens = 1;
    post_chat(server_->url(), r);
  }

  // publishes so far (0 direct), for settle().
  int64_t publishes(const std::string& url) {
    if (proxy_ == nullptr || url != proxy_->url()) return 0;
    return get_proxy_status(url).publishes;
  }

  // Through the proxy, waits until it has parked what the last response left: the
  // publish count has grown past `before` and every slot is back (a slot is given
  // back once its turn is parked, after the response).
  void settle(const std::string& url, int64_t before) {
    if (proxy_ == nullptr || url != proxy_->url()) return;
    wait_until(
        [&] {
          const ProxyStatus status = get_proxy_status(url);
          return status.publishes > before &&
                 status.body.find("\"busy_slots\":0") != std::string::npos;
        },
        publish_wait_msec_max);
  }

  // A streamed request in the current wire format: messages[0] is the system head.
  bool stream(const std::string& url, std::vector<ChatMessage> messages, AgentResult* ret) {
    AgentRequest r{.format = format_, .system = messages.at(0).content, .stream = true};
    r.turns.assign(messages.begin() + 1, messages.end());
    *ret = post_agent(url, r);
    if (ret->http.status == 200 && ret->parsed) return true;
    return fail(url + ": status " + std::to_string(ret->http.status) + ": " +
                ret->http.body.substr(0, 400));
  }

  // Sends `requests` at once and records their figures.
  bool measure(const std::string& url, const std::vector<std::vector<ChatMessage>>& requests,
               Figures* ret) {
    const int64_t before = prompt_tokens_total(server_->url());
    std::vector<AgentResult> results(requests.size());
    std::vector<char> ok(requests.size(), 0);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i)
      clients.emplace_back([&, i] { ok[i] = stream(url, requests[i], &results[i]); });
    for (std::thread& t : clients) t.join();
    ret->prefilled = prompt_tokens_total(server_->url()) - before;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!ok[i]) return false;
      ret->ttft_msec.push_back(results[i].first_content_msec);
      if (results[i].prompt_tokens < 0 || results[i].cached_tokens < 0)
        ret->usage_missing = true;  // llama-server's own streamed Messages: no prompt figures
      ret->prompt_n += results[i].prompt_tokens - results[i].cached_tokens;
      ret->notes += " [" + results[i].http.header("x-kvpark-reuse") +
                    " restored=" + results[i].http.header("x-kvpark-restored-tokens") + "]";
    }
    return true;
  }

  static std::string ttft_cell(const Figures& f) {
    char cell[64];
    if (f.ttft_msec.size() == 1)
      std::snprintf(cell, sizeof cell, "%.1f", f.ttft_msec[0]);
    else
      std::snprintf(cell, sizeof cell, "%.1f / %.1f", max_of(f.ttft_msec), median_of(f.ttft_msec));
    return cell;
  }
  static std::string prefill_cell(const Figures& f) {
    return std::to_string(f.prefilled) + " (" +
           (f.usage_missing ? std::string("not reported") : std::to_string(f.prompt_n)) + ")";
  }

  Options o_;
  std::string work_;
  std::string slots_;
  std::string head_;
  int64_t head_measured_ = 0;
  std::unique_ptr<LlamaServerProcess> server_;
  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<ProxyProcess> proxy_;
  std::vector<Row> rows_;
  WireFormat format_ = WireFormat::chat;

 public:
  void set_format(WireFormat format) { format_ = format; }
};

void usage(FILE* out) {
  std::fprintf(out,
               "Usage: kvpark-proxy-bench [--quick] [--head-tokens N] [--llama-server PATH]\n"
               "         [--proxy PATH] [--kvparkd PATH] [--model PATH | --make-test-model PATH]\n"
               "         [--arch ARCH [--layers N] [--embedding N]]\n"
               "         [--slots N] [--threads N] [--fan-out N] [--api LIST] [--keep]\n"
               "       kvpark-proxy-bench --restore-path [--head-tokens N] [--layers N]\n"
               "         [--embedding N]\n"
               "       kvpark-proxy-bench --overhead [--head-tokens N] [--pairs N]\n"
               "       kvpark-proxy-bench --capacity [--conversations N] [--turns N]\n"
               "         [--head-tokens N] [--layers N] [--embedding N]\n"
               "TTFT and tokens prefilled through kvpark-proxy vs straight to llama-server.\n\n"
               "  --quick             a %zu-token head (a smoke test)\n"
               "  --head-tokens N     system head size in tokens (default %zu)\n"
               "  --keep              keep the work directory and its logs\n"
               "  --api LIST          wire formats, comma-separated: chat, responses, messages\n"
               "                      (default: all three)\n"
               "  --arch ARCH         the test model's family (kvpark-make-test-model --arch)\n"
               "  --restore-path      only the restore path at a realistic geometry (4096-token\n"
               "                      head, --layers 32 --embedding 1024: ~65 KB a token)\n"
               "  --capacity          only kvparkd's arena after sibling conversations over one\n"
               "                      head (3274 tokens, 4 x 2 by default), parked as blocks\n"
               "                      and as whole slot files, at the realistic geometry\n"
               "  --overhead          only the same-server sibling, direct and through the proxy\n"
               "                      in turn, paired (12288-token head, 15 pairs by default)\n"
               "  -h, --help          this help\n"
               "      --version       the version\n"
               "Binaries default to the ones this build knows of.\n",
               head_tokens_quick, head_tokens_default);
}

// "chat,responses,messages" (any of them, in any order).
bool parse_apis(const std::string& list, std::vector<WireFormat>* ret) {
  ret->clear();
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string name = list.substr(at, comma - at);
    bool known = false;
    for (WireFormat f : {WireFormat::chat, WireFormat::responses, WireFormat::messages}) {
      if (name != wire_format_string(f)) continue;
      ret->push_back(f);
      known = true;
    }
    if (!known) return false;
    at = comma + 1;
  }
  return !ret->empty();
}

bool parse(int argc, char** argv, Options* o, int* ret_exit) {
  enum {
    opt_server = 1,
    opt_proxy,
    opt_kvparkd,
    opt_model,
    opt_make,
    opt_head,
    opt_slots,
    opt_threads,
    opt_fan_out,
    opt_restore_path,
    opt_layers,
    opt_embedding,
    opt_overhead,
    opt_pairs,
    opt_arch,
    opt_api,
    opt_capacity,
    opt_conversations,
    opt_turns,
    opt_version
  };
  static const option long_options[] = {{"quick", no_argument, nullptr, 'q'},
                                        {"keep", no_argument, nullptr, 'k'},
                                        {"help", no_argument, nullptr, 'h'},
                                        {"version", no_argument, nullptr, opt_version},
                                        {"llama-server", required_argument, nullptr, opt_server},
                                        {"proxy", required_argument, nullptr, opt_proxy},
                                        {"kvparkd", required_argument, nullptr, opt_kvparkd},
                                        {"model", required_argument, nullptr, opt_model},
                                        {"make-test-model", required_argument, nullptr, opt_make},
                                        {"head-tokens", required_argument, nullptr, opt_head},
                                        {"slots", required_argument, nullptr, opt_slots},
                                        {"threads", required_argument, nullptr, opt_threads},
                                        {"fan-out", required_argument, nullptr, opt_fan_out},
                                        {"restore-path", no_argument, nullptr, opt_restore_path},
                                        {"layers", required_argument, nullptr, opt_layers},
                                        {"embedding", required_argument, nullptr, opt_embedding},
                                        {"overhead", no_argument, nullptr, opt_overhead},
                                        {"pairs", required_argument, nullptr, opt_pairs},
                                        {"arch", required_argument, nullptr, opt_arch},
                                        {"api", required_argument, nullptr, opt_api},
                                        {"capacity", no_argument, nullptr, opt_capacity},
                                        {"conversations", required_argument, nullptr,
                                         opt_conversations},
                                        {"turns", required_argument, nullptr, opt_turns},
                                        {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", long_options, nullptr)) != -1) {
    switch (c) {
      case 'q':
        o->head_tokens = head_tokens_quick;
        break;
      case 'k':
        o->keep = true;
        break;
      case opt_server:
        o->llama_server = optarg;
        break;
      case opt_proxy:
        o->proxy = optarg;
        break;
      case opt_kvparkd:
        o->kvparkd = optarg;
        break;
      case opt_model:
        o->model = optarg;
        break;
      case opt_make:
        o->make_test_model = optarg;
        break;
      case opt_head:
        o->head_tokens = std::strtoull(optarg, nullptr, 10);
        o->head_given = true;
        break;
      case opt_restore_path:
        o->restore_path = true;
        break;
      case opt_overhead:
        o->overhead = true;
        break;
      case opt_capacity:
        o->capacity = true;
        break;
      case opt_conversations:
        o->conversations = std::atoi(optarg);
        break;
      case opt_turns:
        o->turns = std::atoi(optarg);
        break;
      case opt_pairs:
        o->pairs = std::atoi(optarg);
        break;
      case opt_layers:
        o->layers = std::atoi(optarg);
        o->geometry_given = true;
        break;
      case opt_arch:
        o->arch = optarg;
        break;
      case opt_api:
        if (!parse_apis(optarg, &o->apis)) {
          usage(stderr);
          *ret_exit = 2;
          return false;
        }
        break;
      case opt_embedding:
        o->embedding = std::atoi(optarg);
        o->geometry_given = true;
        break;
      case opt_slots:
        o->slots = std::atoi(optarg);
        break;
      case opt_threads:
        o->threads = std::atoi(optarg);
        break;
      case opt_fan_out:
        o->fan_out = std::atoi(optarg);
        break;
      case 'h':
        usage(stdout);
        *ret_exit = 0;
        return false;
      case opt_version:
        std::printf("kvpark-proxy-bench %s\n", kvpark::version);
        *ret_exit = 0;
        return false;
      default:
        usage(stderr);
        *ret_exit = 2;
        return false;
    }
  }
  if (optind != argc || o->head_tokens < 512 || o->slots < 1 || o->threads < 1 || o->fan_out < 1 || o->pairs < 1 ||
      o->conversations < 1 || o->turns < 1) {
    usage(stderr);
    *ret_exit = 2;
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  int exit_code = 0;
  if (!parse(argc, argv, &options, &exit_code)) return exit_code;
  setenv("KVPARKD", options.kvparkd.c_str(), 1);  // DaemonProcess starts this one
  char templ[] = "/tmp/kvpark-proxy-bench-XXXXXX";
  const std::string work = mkdtemp(templ);
  const bool keep = options.keep;
  const int fan_out = options.fan_out;
  bool ok = true;
  // --restore-path and --overhead together: both, in one run (the overhead first).
  if (options.overhead) {
    if (!options.head_given) options.head_tokens = 12288;
    const std::string dir = work + "/overhead";
    std::filesystem::create_directories(dir);
    Bench bench(options, dir);
    ok = bench.setup() && bench.overhead();
  }
  kvpark::bench::RestorePathOptions r{.llama_server = options.llama_server,
                                      .proxy = options.proxy,
                                      .kvparkd = options.kvparkd,
                                      .make_test_model = options.make_test_model};
  r.layers = options.layers;
  r.embedding = options.embedding;
  r.threads = options.threads;
  if (options.restore_path) {
    if (options.head_given) r.head_tokens = options.head_tokens;
    // Both ways of parking, in one run: the whole file for reference.
    for (const char* park_as : {"blocks", "whole"}) {
      r.park_as = park_as;
      const std::string dir = work + "/restore-" + park_as;
      std::filesystem::create_directories(dir);
      ok = kvpark::bench::run_restore_path(r, dir) && ok;
    }
  }
  if (options.capacity) {
    r.head_tokens = options.head_given ? options.head_tokens : 3274;
    r.arena_bytes = 4ull << 30;
    const std::string dir = work + "/capacity";
    std::filesystem::create_directories(dir);
    ok = kvpark::bench::run_capacity(r, options.conversations, options.turns, dir) && ok;
  }
  if (!options.restore_path && !options.overhead && !options.capacity) {
    const std::vector<WireFormat> apis = options.apis;
    Bench bench(std::move(options), work);
    ok = bench.setup();
    for (size_t i = 0; ok && i < apis.size(); ++i) {
      bench.set_format(apis[i]);
      ok = bench.run("sibling B after A",
                     [&](const std::string& url, Figures* f) { return bench.sibling(url, f); }) &&
           bench.run("sibling B after a llama-server restart",
                     [&](const std::string& url, Figures* f) {
                       return bench.sibling_after_restart(url, f);
                     }) &&
           bench.run("fan-out of " + std::to_string(fan_out) + " siblings",
                     [&](const std::string& url, Figures* f) { return bench.fan_out(url, f); }) &&
           bench.run("turn 2 after llama-server restart",
                     [&](const std::string& url, Figures* f) { return bench.restart(url, f); });
    }
    bench.print();
  }
  if (keep)
    std::printf("\nlogs: %s\n", work.c_str());
  else
    std::filesystem::remove_all(work);
  return ok ? 0 : 1;
}
