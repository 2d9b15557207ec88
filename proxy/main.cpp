// kvpark-proxy: an OpenAI-compatible front for unmodified llama-server upstreams
// that parks and restores their slot state through kvparkd (kvpark-proxy(1)).
#include <dirent.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

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
    listener.stop();
  }).detach();
}

// Slot files of proxies that are gone (named kvpark-PID-...): a crash between a save
// and its unlink leaves one behind, and the slot directory is usually tmpfs.
void remove_stale_slot_files(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    long pid = 0;
    if (std::sscanf(e->d_name, "kvpark-%ld-", &pid) != 1 || pid <= 0) continue;
    if (kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
    unlinkat(dirfd(d), e->d_name, 0);
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
  remove_stale_slot_files(proxy.options.slot_dir);
  for (size_t i = 0; i < proxy.options.upstreams.size(); ++i)
    proxy.routes.push_back(std::make_unique<Route>(proxy.options.upstreams[i], proxy.options, i));
  for (auto& route : proxy.routes) route->refresh(true);  // status is complete at "ready"

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
  std::fprintf(stderr, "kvpark-proxy: listening on http://%s:%u, slot directory %s\n",
               proxy.options.listen_host.c_str(), listener.port(),
               proxy.options.slot_dir.c_str());
  std::printf("kvpark-proxy: ready\n");
  std::fflush(stdout);
  listener.run();
  proxy.routes.clear();  // stops the watchers
  return 0;
}
