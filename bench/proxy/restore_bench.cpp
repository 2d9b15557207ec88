// kvpark-proxy-bench --restore-path: the restore path at a realistic KV geometry.
//
// The test model made with --layers 32 --embedding 1024 keeps about 65 KB of state
// per token, like a 3B-8B model, so a 4k-token head is a slot file of a quarter of
// a gigabyte. Measured in one run, on one llama-server:
//   cold       the first request for the head, straight to a fresh llama-server and
//              through the proxy (which prefills the head alone, saves it, parks it
//              in the background and runs the request)
//   restart    sibling B after a llama-server restart: direct (prefilled again) and
//              through the proxy (the head restored from kvparkd)
//   throughput the proxy's part of B's restore (checking the parked payload and
//              writing the slot file, from its log line), llama-server's own
//              /slots/N?action=restore of that very file, and memcpy of as many bytes.
//   blocks     that file split into 64-token blocks and written again from them in
//              memory (integrations/llama/state_image.h): byte-identical, and
//              llama-server restores the file so written.
// The proxy parks as --park-as says (RestorePathOptions::park_as): as blocks, its part
// of the restore writes the slot file from the arena's blocks (proxy/state_blocks.h);
// whole, it copies the parked file out.
#include "bench/proxy/restore_bench.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "integrations/llama/state_image.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"
#include "tests/testing/llama_server_process.h"
#include "tests/testing/openai_http.h"

using namespace kvpark::testing;

namespace kvpark::bench {
namespace {

constexpr int context_margin_tokens = 1024;  // per slot, past the head
constexpr int publish_wait_msec_max = 120'000;
constexpr int memcpy_rounds = 5;
constexpr uint32_t block_tokens = 64;  // the chain hash's chunk

double msec_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

double gb_per_sec(uint64_t bytes, double msec) {
  return msec > 0 ? double(bytes) / (msec * 1e6) : 0;
}

// A number after `key=` in the last line of `log` that has it; -1 if none.
double last_field(const std::string& log, const std::string& key) {
  const size_t at = log.rfind(" " + key + "=");
  if (at == std::string::npos) return -1;
  return std::strtod(log.c_str() + at + key.size() + 2, nullptr);
}

std::string find_restore_file(const std::string& dir) {
  std::string found;
  if (DIR* d = opendir(dir.c_str())) {
    while (const dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > 8 && name.compare(name.size() - 8, 8, ".restore") == 0) found = name;
    }
    closedir(d);
  }
  return found;
}

double memcpy_msec(uint64_t bytes) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> rounds;
  for (int i = 0; i < memcpy_rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), bytes);
    rounds.push_back(msec_since(start));
    from[size_t(i) % bytes] = char(to[size_t(i * 7) % bytes] + 1);  // keep the copy live
  }
  return median_of(rounds);
}

// A slot file split into blocks and written again, each timed once (the file is a
// quarter of a gigabyte: one pass is the measurement).
struct BlockRoundTrip {
  double decompose_msec = -1;  // parse, then gather every block
  double recompose_msec = -1;  // write the file again from the blocks
  bool identical = false;
  std::string refused;  // why the reader refused the file; empty if it did not
};

bool read_whole(const std::string& path, std::vector<uint8_t>* ret) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::fseek(f, 0, SEEK_END);
  ret->resize(size_t(std::ftell(f)));
  std::fseek(f, 0, SEEK_SET);
  const bool ok = std::fread(ret->data(), 1, ret->size(), f) == ret->size();
  std::fclose(f);
  return ok;
}

// The file split into blocks, then written again over `to` in place (its pages
// allocated by a first, untimed write, as a slot's restore file is reused). The
// blocks' memory is touched before the clock starts: a parker would reuse it.
BlockRoundTrip split_and_write(const std::string& from, const std::string& to) {
  BlockRoundTrip trip;
  std::vector<uint8_t> file;
  if (!read_whole(from, &file)) {
    trip.refused = "cannot read " + from;
    return trip;
  }
  llama::StateImage parsed;
  if (!llama::parse_state_image(file, llama::ImageKind::slot_file, &parsed, &trip.refused))
    return trip;
  const uint64_t block_bytes = block_tokens * parsed.layout.token_kv_bytes();
  std::vector<std::vector<uint8_t>> blocks((parsed.cells + block_tokens - 1) / block_tokens,
                                           std::vector<uint8_t>(block_bytes, 0));
  auto start = std::chrono::steady_clock::now();
  if (!llama::parse_state_image(file, llama::ImageKind::slot_file, &parsed, &trip.refused))
    return trip;
  for (uint32_t b = 0; b < blocks.size(); ++b)
    llama::gather_cells(parsed, file.data(), b * block_tokens,
                        std::min(block_tokens, parsed.cells - b * block_tokens), blocks[b].data());
  trip.decompose_msec = msec_since(start);
  FILE* out = std::fopen(to.c_str(), "w+b");
  if (out == nullptr) return trip;
  auto write_again = [&] {
    std::rewind(out);
    return llama::write_state_image(
        parsed.layout, parsed.tokens, parsed.cells, block_tokens,
        [&](uint32_t r) { return blocks[r].data(); },
        [&](std::span<const iovec> pieces) {
          // tmpfs takes a writev whole; a short one shows as a file that differs
          return writev(fileno(out), pieces.data(), int(pieces.size())) >= 0;
        });
  };
  bool written = write_again();
  start = std::chrono::steady_clock::now();
  written = written && write_again();
  trip.recompose_msec = msec_since(start);
  std::fclose(out);
  std::vector<uint8_t> again;
  trip.identical = written && read_whole(to, &again) && again == file;
  return trip;
}

struct Sample {
  double ttft_msec = -1;
  int64_t prefilled = 0;
  ChatResult result;
};

bool fail(const std::string& why) {
  std::fprintf(stderr, "kvpark-proxy-bench: %s\n", why.c_str());
  return false;
}

ChatRequest request(const std::string& head, int user) {
  ChatRequest r;
  r.model = "m";
  r.messages = {{"system", head},
                {"user", "Question " + std::to_string(user) + ":" +
                             english_text(30, 7000 + uint64_t(user)) + "?"}};
  r.stream = true;
  return r;
}

bool measure(LlamaServerProcess& server, const std::string& url, const ChatRequest& r,
             Sample* ret) {
  const int64_t before = prompt_tokens_total(server.url());
  ret->result = post_chat(url, r);
  ret->prefilled = prompt_tokens_total(server.url()) - before;
  ret->ttft_msec = ret->result.first_content_msec >= 0 ? ret->result.first_content_msec
                                                       : ret->result.first_chunk_msec;
  if (ret->result.http.status == 200) return true;
  return fail(url + ": status " + std::to_string(ret->result.http.status) + " " +
              ret->result.http.body.substr(0, 300));
}

}  // namespace

bool run_restore_path(const RestorePathOptions& o, const std::string& work) {
  // Slot files on tmpfs, as a deployment keeps them (/run, /dev/shm): here /tmp may
  // be a disk file system.
  char templ[] = "/dev/shm/kvpark-proxy-bench-slots-XXXXXX";
  const char* shm = mkdtemp(templ);
  const std::string slots = shm != nullptr ? std::string(shm) : work + "/slots";
  std::filesystem::create_directories(slots);
  struct RemoveAtExit {
    std::string path;
    ~RemoveAtExit() {
      std::error_code ignored;
      if (!path.empty()) std::filesystem::remove_all(path, ignored);
    }
  } remove_slots{shm != nullptr ? slots : ""};
  const std::string model = work + "/model-realistic.gguf";
  std::string out;
  if (run_process({o.make_test_model, model, "--seed", "1", "--text-only-output", "1",
                   "--layers", std::to_string(o.layers), "--embedding",
                   std::to_string(o.embedding)},
                  120'000, &out) != 0)
    return fail("cannot make the model: " + out);
  const int per_slot = int((o.head_tokens + context_margin_tokens + 255) / 256 * 256);
  LlamaServerProcess server(LlamaServerConfig{.binary = o.llama_server,
                                              .model = model,
                                              .slot_dir = slots,
                                              .slots = 2,
                                              .context_tokens = per_slot * 2,
                                              .threads = o.threads},
                            work + "/llama-server-realistic.log");
  if (!server.start()) return fail("llama-server did not start: " + server.log_tail());
  size_t words = o.head_tokens / 4;
  std::string head;
  for (int round = 0; round < 4; ++round) {
    head = english_text(words, 11);
    const int64_t n = count_tokens(server.url(), head);
    if (n <= 0) return fail("POST /tokenize failed");
    if (n <= int64_t(o.head_tokens) && n > int64_t(o.head_tokens) * 98 / 100) break;
    words = words * o.head_tokens * 99 / 100 / size_t(n);
  }

  // Direct: a fresh llama-server prefills the whole prompt (the first request, and
  // a sibling after a restart alike).
  Sample direct;
  if (!measure(server, server.url(), request(head, 1), &direct)) return false;

  server.stop();
  if (!server.start()) return fail("llama-server did not restart");
  DaemonProcess daemon(DaemonConfig{.arena_bytes = o.arena_bytes});
  if (!daemon.start()) return fail("kvparkd did not start");
  ProxyProcess proxy(ProxyConfig{.binary = o.proxy,
                                 .upstreams = {{.name = "m", .url = server.url()}},
                                 .slot_dir = slots,
                                 .kvparkd_socket = daemon.socket_path(),
                                 .extra_args = {"--park-as", o.park_as}},
                     work + "/proxy-realistic-" + o.park_as + ".log");
  if (!proxy.start()) return fail("kvpark-proxy did not start: " + proxy.log_tail());
  Sample cold;
  const int64_t publishes_before = get_proxy_status(proxy.url()).publishes;
  if (!measure(server, proxy.url(), request(head, 1), &cold)) return false;
  // The head and the turn parked (in the background), before the restart.
  (void)wait_until([&] { return get_proxy_status(proxy.url()).publishes >= publishes_before + 2; },
                   publish_wait_msec_max);
  server.stop();
  if (!server.start()) return fail("llama-server did not restart");
  Sample restored;
  if (!measure(server, proxy.url(), request(head, 2), &restored)) return false;
  // llama-server's own restore of the very file the proxy wrote for B (kept in
  // place for the slot's next restore), into the other slot.
  double own_msec = -1;
  uint64_t own_bytes = 0;
  const std::string name = find_restore_file(slots);
  struct stat st;
  if (name.empty() || stat((slots + "/" + name).c_str(), &st) != 0)
    return fail("no restore file in " + slots);
  own_bytes = uint64_t(st.st_size);
  const std::string other = restored.result.http.header("x-kvpark-slot") == "0" ? "1" : "0";
  const auto start = std::chrono::steady_clock::now();
  const HttpResult own = http_post(server.url(), "/slots/" + other + "?action=restore",
                                   "{\"filename\": \"" + name + "\"}");
  own_msec = msec_since(start);
  if (own.status != 200) return fail("own restore: " + own.body);
  const BlockRoundTrip trip = split_and_write(slots + "/" + name, slots + "/blocks.restore");
  const HttpResult blocks_restore =
      http_post(server.url(), "/slots/" + other + "?action=restore",
                "{\"filename\": \"blocks.restore\"}");
  proxy.stop();  // SIGTERM: B's log line is written once its turn is parked
  const std::string log = file_tail(proxy.log_path(), 1 << 16);
  const double bytes = last_field(log, "restore_bytes");
  const double file_msec = last_field(log, "restore_file_ms");
  const double upstream_msec = last_field(log, "restore_upstream_ms");
  const double copy_msec = memcpy_msec(own_bytes > 0 ? own_bytes : uint64_t(bytes));

  std::printf(
      "\nkvpark-proxy-bench --restore-path, parked as %s: test model --layers %d --embedding %d, "
      "head %zu tokens, slot file %.1f MB (%.1f KB/token), %d threads, slot files in %s\n\n",
      o.park_as.c_str(), o.layers, o.embedding, o.head_tokens, bytes / 1e6,
      bytes / 1e3 / double(restored.result.header_int("x-kvpark-restored-tokens")), o.threads,
      slots.c_str());
  std::printf("| case | direct TTFT ms | proxy TTFT ms | direct prefilled | proxy prefilled |\n"
              "|---|---:|---:|---:|---:|\n");
  std::printf("| first request for the head (cold) | %.1f | %.1f | %lld | %lld |\n",
              direct.ttft_msec, cold.ttft_msec, static_cast<long long>(direct.prefilled),
              static_cast<long long>(cold.prefilled));
  std::printf("| sibling B after a llama-server restart | %.1f | %.1f | %lld | %lld |\n\n",
              direct.ttft_msec, restored.ttft_msec, static_cast<long long>(direct.prefilled),
              static_cast<long long>(restored.prefilled));
  std::printf("| restore path, same bytes | ms | GB/s |\n|---|---:|---:|\n");
  std::printf("| proxy's part (%s, checked as it is written) | %.1f | %.2f |\n",
              o.park_as == "blocks" ? "the slot file written from the arena's blocks"
                                    : "the parked slot file copied out",
              file_msec,
              gb_per_sec(uint64_t(bytes), file_msec));
  std::printf("| llama-server's load in that restore | %.1f | %.2f |\n", upstream_msec,
              gb_per_sec(uint64_t(bytes), upstream_msec));
  std::printf("| llama-server's own /slots restore of the file | %.1f | %.2f |\n", own_msec,
              gb_per_sec(own_bytes, own_msec));
  std::printf("| memcpy of as many bytes | %.1f | %.2f |\n", copy_msec,
              gb_per_sec(own_bytes, copy_msec));
  std::printf("| the file split into %u-token blocks (parse + gather) | %.1f | %.2f |\n",
              block_tokens, trip.decompose_msec, gb_per_sec(own_bytes, trip.decompose_msec));
  std::printf("| the file written again from the blocks | %.1f | %.2f |\n", trip.recompose_msec,
              gb_per_sec(own_bytes, trip.recompose_msec));
  std::printf("\nproxy's part / llama-server's own restore: %.2f (goal <= %s)\n",
              own_msec > 0 ? file_msec / own_msec : -1, o.park_as == "blocks" ? "1.0" : "1.5");
  std::printf("written again from blocks / llama-server's own restore: %.2f (goal <= 1.0); "
              "byte-identical: %s; llama-server restores it: %s%s\n",
              own_msec > 0 ? trip.recompose_msec / own_msec : -1, trip.identical ? "yes" : "no",
              blocks_restore.status == 200 ? "yes" : "no",
              trip.refused.empty() ? "" : ("; refused: " + trip.refused).c_str());
  std::printf("B: reuse %s, restored %s tokens\n",
              restored.result.http.header("x-kvpark-reuse").c_str(),
              restored.result.http.header("x-kvpark-restored-tokens").c_str());
  return bytes > 0 && file_msec >= 0 && trip.identical && blocks_restore.status == 200;
}

}  // namespace kvpark::bench
