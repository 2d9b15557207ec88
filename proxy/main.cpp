// kvpark-proxy: an OpenAI-compatible front for unmodified llama-server upstreams
// that parks and restores their slot state through kvparkd (kvpark-proxy(1)).
#include <dirent.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "http/listener.h"
#include "proto/limits.h"
#include "proxy/front.h"

namespace {

// Requests served at once (followers of a single flight wait on a worker).
constexpr size_t front_worker_threads = 64;
static_assert(front_worker_threads < kvpark::limits::http_proxy_connections_per_peer_max,
              "a client fanning out to every worker still has room to send more");

// SIGTERM/SIGINT: a thread waits for them and stops the listener (no work in a
// signal handler).
void stop_on_signals(kvpark::http::Listener& listener) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  std::thread([signals, &listener] {
    int received = 0;
    sigwait(&signals, &received);
    std::fprintf(stderr, "kvpark-proxy: stopping on %s\n",
                 received == SIGTERM ? "SIGTERM" : "SIGINT");
    listener.stop();
  }).detach();
}

// Slot files of proxies that are gone (named kvpark-PID-...), or with `own`, this
// proxy's: each slot keeps its restore file between restores (overwritten in
// place), a crash between a save and its unlink leaves one behind, and the slot
// directory is usually tmpfs.
void remove_slot_files(const std::string& dir, bool own) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    long pid = 0;
    if (std::sscanf(e->d_name, "kvpark-%ld-", &pid) != 1 || pid <= 0) continue;
    const bool gone = kill(pid_t(pid), 0) != 0 && errno == ESRCH;
    if (gone || (own && pid == long(getpid()))) unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvpark::proxy;
  // Before any thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  ProxyState proxy;
  proxy.options = default_options();
  bool exit_now = false;
  std::string error;
  if (!parse_command_line(argc, argv, proxy.options, exit_now, error)) {
    std::fprintf(stderr, "kvpark-proxy: %s\n", error.c_str());
    return 2;
  }
  if (exit_now) return 0;
  if (mkdir(proxy.options.slot_dir.c_str(), 0770) != 0 && errno != EEXIST) {
    std::fprintf(stderr, "kvpark-proxy: slot directory %s: %s\n", proxy.options.slot_dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  remove_slot_files(proxy.options.slot_dir, /*own=*/false);
  // "ready" once every upstream is verified (each Route checks its own, then tells).
  std::atomic<bool> routes_built{false};
  std::atomic<bool> announced{false};
  auto announce_when_ready = [&] {
    if (!routes_built || announced) return;
    for (const auto& route : proxy.routes)
      if (!route->ready()) return;
    if (announced.exchange(true)) return;
    std::printf("kvpark-proxy: ready\n");
    std::fflush(stdout);
  };
  for (size_t i = 0; i < proxy.options.upstreams.size(); ++i)
    proxy.routes.push_back(std::make_unique<Route>(proxy.options.upstreams[i], proxy.options, i,
                                                   announce_when_ready));
  routes_built = true;

  // Slow or oversized clients are held off in front of the workers (http/listener.h);
  // a port in use fails here ("address already in use"), never shared.
  kvpark::http::RouteServer server;
  install_routes(proxy, server);
  server.set_payload_max_length(kvpark::limits::http_proxy_body_bytes_max);
  kvpark::http::Listener listener(
      server, {.host = proxy.options.listen_host,
               .port = proxy.options.listen_port,
               .worker_threads = front_worker_threads,
               .body_bytes_max = kvpark::limits::http_proxy_body_bytes_max,
               .connections_per_peer_max = kvpark::limits::http_proxy_connections_per_peer_max});
  if (std::string listen_error; !listener.bind(listen_error)) {
    std::fprintf(stderr, "kvpark-proxy: %s\n", listen_error.c_str());
    return 1;
  }
  stop_on_signals(listener);
  std::fprintf(stderr,
               "kvpark-proxy %s started: listening on http://%s:%u (OpenAI base URL http://%s:%u/v1), "
               "slot directory %s; verifying %zu upstream(s)\n",
               version, proxy.options.listen_host.c_str(), listener.port(),
               proxy.options.listen_host.c_str(), listener.port(),
               proxy.options.slot_dir.c_str(), proxy.routes.size());
  std::printf("kvpark-proxy: listening\n");
  std::fflush(stdout);
  std::thread serving([&] { listener.run(); });
  // /health answers 503 with the reason meanwhile; the watchers retry every second.
  for (auto& route : proxy.routes) route->check_process();
  announce_when_ready();
  serving.join();
  proxy.background.wait_idle();  // heads being parked
  proxy.routes.clear();          // stops the watchers
  remove_slot_files(proxy.options.slot_dir, /*own=*/true);
  std::fprintf(stderr, "kvpark-proxy: stopped\n");
  return 0;
}
