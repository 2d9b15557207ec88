// Section 1: LOOKUP round-trip latency for a 16k-token prompt whose blocks are all parked.
//
// One namespace per block size; the parent publishes the 16,384-token head once,
// then forks N client processes, each with its own connection. Every client
// measures, per iteration:
//  - full:   kvpark_lookup + kvpark_plan_release, as an engine calls them: chain
//            hashing of the prompt, LOOKUP, exact-token confirmation of every block
//            against the arena, RELEASE;
//  - socket: the same LOOKUP and RELEASE frames through libkvpark's Channel with the
//            chunk hashes computed beforehand and no confirmation: the daemon and
//            socket cost alone (frame encoding and decoding included).
// The prompt is the parked head plus a 37-token new turn, so every block is restorable
// (a restore leaves at least one token to prefill). Clients start together on a
// barrier; percentiles pool every client's samples.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "bench/bench.h"
#include "client/chain_hash.h"
#include "client/channel.h"
#include "client/kvpark.h"
#include "proto/limits.h"
#include "proto/wire.h"

namespace kvpark::bench {
namespace {

constexpr size_t turn_tokens = 37;            // the new user turn after the parked head
constexpr uint64_t block_payload_bytes = 1024;  // small: latency does not read payloads
constexpr uint64_t publisher_session = 1;

enum ChildExit { child_ok = 0, child_mismatch = 3, child_call_failed = 4 };

kvpark_namespace namespace_for(uint32_t block_tokens) {
  return {.id = {0xbe5c00000000ull + block_tokens, 1},
          .block_tokens = block_tokens,
          .block_payload_bytes = block_payload_bytes,
          .snapshot_required = 0,
          .prefill_tokens_per_second = 0,
          .client_name = "kvpark-bench"};
}

bool publish_head(const std::string& socket, uint32_t block_tokens,
                  const std::vector<int32_t>& prompt, std::string& ret_error) {
  const kvpark_namespace ns = namespace_for(block_tokens);
  kvpark_client* client = nullptr;
  if (kvpark_status s = kvpark_connect(socket.c_str(), &ns, &client); s != KVPARK_OK) {
    ret_error = std::string("connect: ") + kvpark_status_string(s);
    return false;
  }
  const size_t blocks = prompt_tokens / block_tokens;
  const kvpark_publish_options options{.session_id = publisher_session,
                                       .entry_class = KVPARK_CLASS_SHARED,
                                       .evidence = KVPARK_EVIDENCE_ENGINE_STRUCTURAL};
  kvpark_reservation* r = nullptr;
  kvpark_status s = kvpark_reserve_blocks(client, &options, prompt.data(), prompt.size(), 0,
                                          blocks, &r);
  if (s == KVPARK_OK) {
    for (size_t i = 0; i < kvpark_reservation_block_count(r); ++i) {
      if (void* p = kvpark_reservation_block(r, i); p != nullptr) {
        std::memset(p, int(i & 0xff), block_payload_bytes);
      }
    }
    s = kvpark_seal(r);
  }
  kvpark_disconnect(client);
  if (s != KVPARK_OK) ret_error = std::string("publish: ") + kvpark_status_string(s);
  return s == KVPARK_OK;
}

// One client process: connect, warm up, wait at the barrier, measure both modes.
int run_client(const LookupConfig& config, uint32_t block_tokens,
               const std::vector<int32_t>& prompt, uint64_t session, int ready_fd, int go_fd,
               uint32_t* full_nsec, uint32_t* socket_nsec) {
  const kvpark_namespace ns = namespace_for(block_tokens);
  kvpark_client* client = nullptr;
  if (kvpark_connect(config.socket_path.c_str(), &ns, &client) != KVPARK_OK) {
    return child_call_failed;
  }
  // The socket-only path: a second connection driven below the C ABI.
  wire::HelloRequest hello;
  hello.protocol_version = limits::protocol_version;
  hello.namespace_id = {ns.id.low, ns.id.high};
  hello.geometry = {.block_tokens = block_tokens, .block_payload_bytes = block_payload_bytes,
                    .snapshot_required = false};
  hello.client_name = "kvpark-bench-raw";
  client::Channel channel(config.socket_path, hello);
  client::Attachment attachment;
  if (channel.connect(attachment) != Status::Ok) return child_call_failed;
  wire::LookupRequest request;
  request.session_id = session;
  request.prompt_tokens = static_cast<uint32_t>(prompt.size());
  const size_t chunks = prompt.size() / block_tokens;
  request.chunk_hashes.resize(chunks);
  client::chain_hashes(hello.namespace_id, {prompt.data(), chunks * block_tokens}, block_tokens,
                       request.chunk_hashes);
  request.tail_tokens.assign(prompt.begin() + chunks * block_tokens, prompt.end());
  std::vector<uint8_t> lookup_frame, release_frame, body;
  wire::encode(request, 0, lookup_frame);
  const uint32_t expected = prompt_tokens;

  auto full_once = [&]() -> int {
    kvpark_plan* plan = nullptr;
    if (kvpark_lookup(client, session, prompt.data(), prompt.size(), &plan) != KVPARK_OK) {
      return child_call_failed;
    }
    const uint32_t restorable = kvpark_plan_restorable_tokens(plan);
    kvpark_plan_release(plan);
    return restorable == expected ? child_ok : child_mismatch;
  };
  auto socket_once = [&]() -> int {
    Status answer = Status::Ok;
    if (channel.call(lookup_frame, 0, answer, body, attachment) != Status::Ok ||
        answer != Status::Ok) {
      return child_call_failed;
    }
    wire::LookupReply reply;
    if (wire::decode(body, reply) != Status::Ok) return child_call_failed;
    release_frame.clear();
    wire::encode(wire::ReleaseRequest{reply.lease_id}, 0, release_frame);
    if (channel.call(release_frame, 0, answer, body, attachment) != Status::Ok ||
        answer != Status::Ok) {
      return child_call_failed;
    }
    return reply.restorable_tokens == expected ? child_ok : child_mismatch;
  };

  for (int i = 0; i < config.warmup; ++i) {
    if (int rc = full_once(); rc != child_ok) return rc;
    if (int rc = socket_once(); rc != child_ok) return rc;
  }
  const char ready = 'r';
  if (write(ready_fd, &ready, 1) != 1) return child_call_failed;
  char go;
  while (read(go_fd, &go, 1) > 0) {  // EOF: everyone starts
  }
  for (int i = 0; i < config.iterations; ++i) {
    const uint64_t t0 = now_nsec();
    const int rc = full_once();
    full_nsec[i] = static_cast<uint32_t>(std::min<uint64_t>(now_nsec() - t0, UINT32_MAX));
    if (rc != child_ok) return rc;
  }
  for (int i = 0; i < config.iterations; ++i) {
    const uint64_t t0 = now_nsec();
    const int rc = socket_once();
    socket_nsec[i] = static_cast<uint32_t>(std::min<uint64_t>(now_nsec() - t0, UINT32_MAX));
    if (rc != child_ok) return rc;
  }
  kvpark_disconnect(client);
  return child_ok;
}

bool run_round(const LookupConfig& config, uint32_t block_tokens,
               const std::vector<int32_t>& prompt, int clients, LookupResult& ret_result,
               std::string& ret_error) {
  const size_t per_client = size_t(config.iterations);
  const size_t samples_bytes = size_t(clients) * per_client * 2 * sizeof(uint32_t);
  void* shared = mmap(nullptr, samples_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
  if (shared == MAP_FAILED) {
    ret_error = "mmap of the sample buffer failed";
    return false;
  }
  auto* samples = static_cast<uint32_t*>(shared);
  int ready_pipe[2], go_pipe[2];
  if (pipe2(ready_pipe, O_CLOEXEC) != 0 || pipe2(go_pipe, O_CLOEXEC) != 0) {
    ret_error = "pipe2 failed";
    munmap(shared, samples_bytes);
    return false;
  }
  const pid_t parent = getpid();
  std::vector<pid_t> children;
  for (int c = 0; c < clients; ++c) {
    const pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(child_call_failed);
      close(ready_pipe[0]);
      close(go_pipe[1]);
      uint32_t* mine = samples + size_t(c) * per_client * 2;
      _exit(run_client(config, block_tokens, prompt, 100 + uint64_t(c), ready_pipe[1],
                       go_pipe[0], mine, mine + per_client));
    }
    if (pid > 0) children.push_back(pid);
  }
  close(ready_pipe[1]);
  close(go_pipe[0]);
  int ready = 0;
  char byte;
  while (ready < int(children.size()) && read(ready_pipe[0], &byte, 1) == 1) ++ready;
  close(go_pipe[1]);  // go
  close(ready_pipe[0]);
  bool ok = int(children.size()) == clients;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != child_ok) {
      ok = false;
      ret_error = "lookup client exited with " +
                  std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
                  (WIFEXITED(status) && WEXITSTATUS(status) == child_mismatch
                       ? " (restorable tokens differ from the parked head)"
                       : " (a libkvpark call failed)");
    }
  }
  if (ok) {
    std::vector<uint32_t> full, socket;
    for (int c = 0; c < clients; ++c) {
      const uint32_t* mine = samples + size_t(c) * per_client * 2;
      full.insert(full.end(), mine, mine + per_client);
      socket.insert(socket.end(), mine + per_client, mine + 2 * per_client);
    }
    ret_result = {.block_tokens = block_tokens,
                  .clients = clients,
                  .restorable_tokens = static_cast<uint32_t>(prompt_tokens),
                  .full = percentiles(full),
                  .socket = percentiles(socket)};
  }
  munmap(shared, samples_bytes);
  return ok;
}

}  // namespace

Percentiles run_socket_floor(int iterations) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return {};
  char message[64] = {};
  const pid_t parent = getpid();
  const pid_t echo = fork();
  if (echo == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);
    close(pair[0]);
    while (recv(pair[1], message, sizeof message, 0) > 0) {
      if (send(pair[1], message, sizeof message, MSG_NOSIGNAL) < 0) break;
    }
    _exit(0);
  }
  close(pair[1]);
  std::vector<uint32_t> samples;
  for (int i = 0; echo > 0 && i < iterations + iterations / 10; ++i) {
    const uint64_t t0 = now_nsec();
    if (send(pair[0], message, sizeof message, MSG_NOSIGNAL) < 0 ||
        recv(pair[0], message, sizeof message, 0) <= 0) {
      break;
    }
    if (i >= iterations / 10) samples.push_back(static_cast<uint32_t>(now_nsec() - t0));
  }
  close(pair[0]);
  if (echo > 0) waitpid(echo, nullptr, 0);
  return percentiles(samples);
}

bool run_lookup_bench(const LookupConfig& config, std::vector<LookupResult>& ret_results,
                      std::string& ret_error) {
  std::vector<int32_t> prompt = make_tokens(1, prompt_tokens + turn_tokens);
  for (uint32_t block_tokens : config.block_tokens) {
    if (!publish_head(config.socket_path, block_tokens, prompt, ret_error)) return false;
    for (int clients : config.clients) {
      LookupResult result;
      if (!run_round(config, block_tokens, prompt, clients, result, ret_error)) return false;
      ret_results.push_back(result);
    }
  }
  return true;
}

}  // namespace kvpark::bench
