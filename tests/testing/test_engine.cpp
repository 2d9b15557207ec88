// kvpark-test-engine: a stand-in engine process driven by integration tests.
//
// It connects with libkvpark like a real engine, publishes or restores a prompt
// made of a shared head and a private body (tests/testing/content.h), and checks
// every restored byte. Modes that must be killed mid-operation print "ready" at
// the point of interest and then wait forever.
//
// Exit codes: 0 ok, 2 usage, 3 restored bytes differ, 4 a libkvpark call failed.
#include <fcntl.h>
#include <getopt.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "client/kvpark.h"
#include "tests/testing/content.h"

using namespace kvpark::testing;

namespace {

struct Options {
  std::string socket;
  std::string mode;
  uint64_t ns_low = 1;
  uint32_t block_tokens = 64;
  uint64_t block_bytes = 64 * 1024;
  uint64_t head_seed = 1, body_seed = 2;
  size_t head_tokens = 1024, body_tokens = 0;
  uint64_t session = 0;
  uint64_t snapshot_bytes = 0;  // publish a snapshot at the prompt's end too
  int hybrid = 0;  // blocks and a required snapshot (block_tokens > 0)
  int iterations = 1;
  int shared = 0;
  uint32_t wait_msec = 0;  // verify: wait this long for promotions or another engine's prefill
  std::string prefill_until;    // publish: a modeled prefill between reserve and write that
                                // lasts until the writer of this FIFO closes it
  uint32_t prefill_rate = 0;    // tokens/s declared at HELLO (0: unknown)
  int connections = 1;          // verify: this many connections at once, one thread each
};

[[noreturn]] void fail(const char* what, kvpark_status s) {
  fprintf(stderr, "kvpark-test-engine: %s: %s\n", what, kvpark_status_string(s));
  exit(4);
}

[[noreturn]] void wait_forever() {
  printf("ready\n");
  fflush(stdout);
  for (;;) pause();
}

// Blocks until the writer of the FIFO at `path` has opened and closed it: a test
// ends a modeled prefill exactly when it has seen what it waits for.
void wait_until_closed(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    perror(path.c_str());
    exit(2);
  }
  char c;
  while (read(fd, &c, 1) > 0 || errno == EINTR) {
  }
  close(fd);
}

std::vector<int32_t> prompt(const Options& o, uint64_t body_seed) {
  std::vector<int32_t> tokens = make_tokens(o.head_seed, o.head_tokens);
  std::vector<int32_t> body = make_tokens(body_seed, o.body_tokens);
  tokens.insert(tokens.end(), body.begin(), body.end());
  return tokens;
}

std::vector<kvpark_hash128> hashes_of(const Options& o, const std::vector<int32_t>& tokens,
                                      uint32_t chain) {
  std::vector<kvpark_hash128> h(tokens.size() / chain);
  kvpark_chain_hashes({o.ns_low, 0}, tokens.data(), chain, h.size(), h.data());
  return h;
}

uint64_t snapshot_key(const Options& o, const std::vector<int32_t>& tokens, uint32_t position) {
  uint64_t key = mix64(position ^ o.ns_low);
  for (uint32_t i = 0; i < position; ++i) key = mix64(key + static_cast<uint32_t>(tokens[i]));
  return key;
}

// Publishes every block of `tokens` (and a snapshot at its end if asked).
// `stop_at`: "reserve", "write", "seal" to hang at that point.
int publish(kvpark_client* c, const Options& o, const std::vector<int32_t>& tokens,
            const std::string& stop_at) {
  const uint32_t chain = kvpark_chain_tokens(c);
  kvpark_publish_options options{o.session,
                                 o.shared ? KVPARK_CLASS_SHARED : KVPARK_CLASS_PRIVATE,
                                 KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  size_t written = 0;
  const size_t blocks = o.block_tokens > 0 ? tokens.size() / o.block_tokens : 0;
  if (blocks > 0) {
    const auto hashes = hashes_of(o, tokens, chain);
    kvpark_reservation* r = nullptr;
    kvpark_status s = kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, blocks, &r);
    if (s != KVPARK_OK) fail("reserve blocks", s);
    if (stop_at == "reserve") wait_forever();
    if (!o.prefill_until.empty()) {
      printf("reserved\n");  // a leader: followers may now find its prefix in flight
      fflush(stdout);
      wait_until_closed(o.prefill_until);
    }
    for (size_t i = 0; i < blocks; ++i) {
      void* p = kvpark_reservation_block(r, i);
      if (p == nullptr) continue;
      if (stop_at == "write" && written == 1) wait_forever();
      fill_payload(payload_key(hashes[i]), p, o.block_bytes);
      ++written;
    }
    if (stop_at == "seal") wait_forever();
    if ((s = kvpark_seal(r)) != KVPARK_OK) fail("seal blocks", s);
  }
  if (o.snapshot_bytes > 0) {
    const auto position = static_cast<uint32_t>(tokens.size());
    kvpark_reservation* r = nullptr;
    kvpark_status s = kvpark_reserve_snapshot(c, &options, tokens.data(), tokens.size(),
                                              o.snapshot_bytes, &r);
    if (s == KVPARK_OK) {
      fill_payload(snapshot_key(o, tokens, position), kvpark_reservation_snapshot(r),
                   o.snapshot_bytes);
      if ((s = kvpark_seal(r)) != KVPARK_OK) fail("seal snapshot", s);
    } else if (s != KVPARK_ALREADY_PRESENT && s != KVPARK_IN_FLIGHT) {
      fail("reserve snapshot", s);
    }
  }
  printf("published %zu\n", written);
  return 0;
}

// Looks the prompt up and checks every restored byte; prints "restored N KIND".
int verify(kvpark_client* c, const Options& o, const std::vector<int32_t>& tokens, bool hold) {
  const uint32_t chain = kvpark_chain_tokens(c);
  kvpark_plan* plan = nullptr;
  kvpark_status s = kvpark_lookup(c, o.session, tokens.data(), tokens.size(), &plan);
  if (s != KVPARK_OK) fail("lookup", s);
  if (o.wait_msec > 0 && kvpark_plan_inflight_tokens(plan) > 0) {
    // Single flight: another engine is prefilling this prefix; wait for it.
    printf("following %u\n", kvpark_plan_inflight_tokens(plan));
    fflush(stdout);
    s = kvpark_plan_wait(plan, o.wait_msec);
    if (s != KVPARK_OK && s != KVPARK_TIMEOUT) fail("wait", s);
    printf("followed %s\n", s == KVPARK_OK ? "ok" : "timeout");
  }
  if (o.wait_msec > 0 && kvpark_plan_pending_tokens(plan) > kvpark_plan_restorable_tokens(plan)) {
    printf("waiting\n");  // tests kill the daemon here
    fflush(stdout);
    s = kvpark_plan_wait(plan, o.wait_msec);
    if (s != KVPARK_OK && s != KVPARK_TIMEOUT) fail("wait", s);
  }
  const auto hashes = hashes_of(o, tokens, chain);
  // Copied out through the verifying copy, as an engine would.
  bool good = true;
  std::vector<uint8_t> copy(o.block_bytes);
  for (size_t i = 0; i < kvpark_plan_block_count(plan); ++i) {
    good = good && kvpark_plan_copy_block(plan, i, copy.data()) == KVPARK_OK &&
           payload_matches(payload_key(hashes[i]), copy.data(), o.block_bytes);
  }
  uint64_t snapshot_bytes = 0;
  uint32_t position = 0;
  if (kvpark_plan_snapshot(plan, &snapshot_bytes, &position) != nullptr) {
    copy.resize(snapshot_bytes);
    good = good && kvpark_plan_copy_snapshot(plan, copy.data(), snapshot_bytes) == KVPARK_OK &&
           payload_matches(snapshot_key(o, tokens, position), copy.data(), snapshot_bytes);
  }
  if (kvpark_plan_capture_hint(plan) > 0) printf("hint %u\n", kvpark_plan_capture_hint(plan));
  printf("restored %u %d\n", kvpark_plan_restorable_tokens(plan), kvpark_plan_reuse_kind(plan));
  fflush(stdout);
  if (hold) wait_forever();
  kvpark_plan_release(plan);
  return good ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  static const option long_options[] = {
      {"socket", required_argument, nullptr, 's'},  {"ns", required_argument, nullptr, 'n'},
      {"block-tokens", required_argument, nullptr, 'b'},
      {"block-bytes", required_argument, nullptr, 'B'},
      {"head-seed", required_argument, nullptr, 'h'},
      {"head-tokens", required_argument, nullptr, 'H'},
      {"body-seed", required_argument, nullptr, 'y'},
      {"body-tokens", required_argument, nullptr, 'Y'},
      {"session", required_argument, nullptr, 'S'},
      {"snapshot-bytes", required_argument, nullptr, 'p'},
      {"iterations", required_argument, nullptr, 'i'},
      {"shared", no_argument, nullptr, 'c'},
      {"hybrid", no_argument, nullptr, 'X'},
      {"wait-msec", required_argument, nullptr, 'w'},
      {"prefill-until-closed", required_argument, nullptr, 'U'},
      {"prefill-rate", required_argument, nullptr, 'R'},
      {"connections", required_argument, nullptr, 'C'},
      {nullptr, 0, nullptr, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "", long_options, nullptr)) != -1) {
    switch (ch) {
      case 's': o.socket = optarg; break;
      case 'n': o.ns_low = strtoull(optarg, nullptr, 0); break;
      case 'b': o.block_tokens = static_cast<uint32_t>(strtoul(optarg, nullptr, 0)); break;
      case 'B': o.block_bytes = strtoull(optarg, nullptr, 0); break;
      case 'h': o.head_seed = strtoull(optarg, nullptr, 0); break;
      case 'H': o.head_tokens = strtoull(optarg, nullptr, 0); break;
      case 'y': o.body_seed = strtoull(optarg, nullptr, 0); break;
      case 'Y': o.body_tokens = strtoull(optarg, nullptr, 0); break;
      case 'S': o.session = strtoull(optarg, nullptr, 0); break;
      case 'p': o.snapshot_bytes = strtoull(optarg, nullptr, 0); break;
      case 'i': o.iterations = atoi(optarg); break;
      case 'c': o.shared = 1; break;
      case 'X': o.hybrid = 1; break;
      case 'w': o.wait_msec = static_cast<uint32_t>(strtoul(optarg, nullptr, 0)); break;
      case 'U': o.prefill_until = optarg; break;
      case 'R': o.prefill_rate = static_cast<uint32_t>(strtoul(optarg, nullptr, 0)); break;
      case 'C': o.connections = atoi(optarg); break;
      default: return 2;
    }
  }
  if (optind + 1 != argc) {
    fprintf(stderr, "usage: kvpark-test-engine [options] publish|verify|hold-lease|"
                    "hang-in-reserve|hang-while-writing|hang-before-seal|stress\n");
    return 2;
  }
  o.mode = argv[optind];
  kvpark_namespace ns{};
  ns.id = {o.ns_low, 0};
  ns.block_tokens = o.block_tokens;
  ns.block_payload_bytes = o.block_tokens > 0 ? o.block_bytes : 0;
  ns.snapshot_required = o.block_tokens == 0 || o.hybrid != 0;
  ns.client_name = "kvpark-test-engine";
  ns.prefill_tokens_per_second = o.prefill_rate;
  if (o.mode == "verify" && o.connections > 1) {
    // Several followers in one process, each on its own connection.
    const std::vector<int32_t> tokens = prompt(o, o.body_seed);
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < o.connections; ++i) {
      threads.emplace_back([&] {
        kvpark_client* own = nullptr;
        if (kvpark_connect(o.socket.c_str(), &ns, &own) != KVPARK_OK) {
          ++failures;
          return;
        }
        if (verify(own, o, tokens, false) != 0) ++failures;
        kvpark_disconnect(own);
      });
    }
    for (std::thread& t : threads) t.join();
    return failures == 0 ? 0 : 3;
  }
  kvpark_client* c = nullptr;
  kvpark_status s = kvpark_connect(o.socket.c_str(), &ns, &c);
  if (s != KVPARK_OK) fail("connect", s);
  const std::vector<int32_t> tokens = prompt(o, o.body_seed);
  int rc = 0;
  if (o.mode == "publish") rc = publish(c, o, tokens, "");
  else if (o.mode == "verify") rc = verify(c, o, tokens, false);
  else if (o.mode == "hold-lease") rc = verify(c, o, tokens, true);
  else if (o.mode == "hang-in-reserve") rc = publish(c, o, tokens, "reserve");
  else if (o.mode == "hang-while-writing") rc = publish(c, o, tokens, "write");
  else if (o.mode == "hang-before-seal") rc = publish(c, o, tokens, "seal");
  else if (o.mode == "stress") {
    // Each iteration: a new body over the shared head; publish, then restore and check.
    for (int i = 0; i < o.iterations && rc == 0; ++i) {
      const std::vector<int32_t> t = prompt(o, o.body_seed * 1000003 + i);
      publish(c, o, t, "");
      rc = verify(c, o, t, false);
    }
  } else {
    fprintf(stderr, "kvpark-test-engine: unknown mode '%s'\n", o.mode.c_str());
    rc = 2;
  }
  kvpark_disconnect(c);
  return rc;
}
