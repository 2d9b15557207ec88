// redis-server children for tests and benchmarks (see redis_process.h).
#include "tests/testing/redis_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr int redis_ready_msec_max = 15'000;
constexpr int cluster_ok_msec_max = 30'000;
constexpr int start_attempts_max = 8;
constexpr int cluster_bus_port_offset = 10'000;

std::string find_on_path(const char* env_name, const char* name) {
  if (const char* v = getenv(env_name); v != nullptr && *v != '\0') return v;
  const char* path = getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

bool port_free(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_in addr = loopback(port);
  const bool free = bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return free;
}

// A port whose cluster-bus port is free too.
int free_redis_port() {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = free_tcp_port();
    if (port > 0 && port + cluster_bus_port_offset <= 65535 &&
        port_free(port + cluster_bus_port_offset)) {
      return port;
    }
  }
  return -1;
}

// One RESP round trip on a fresh connection: true when `reply` starts the answer.
bool ask(int port, const std::string& command, const std::string& reply_prefix,
         std::string* ret_reply = nullptr) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_in addr = loopback(port);
  bool ok = false;
  std::string got;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
      write(fd, command.data(), command.size()) == static_cast<ssize_t>(command.size())) {
    const uint64_t deadline = now_msec() + 1000;
    char buffer[4096];
    while (now_msec() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      const ssize_t n = read(fd, buffer, sizeof buffer);
      if (n <= 0) break;
      got.append(buffer, static_cast<size_t>(n));
      if (got.find("\r\n") != std::string::npos && got.size() >= reply_prefix.size()) {
        // Bulk replies: wait for the whole body.
        if (got[0] == '$') {
          const size_t len = std::stoul(got.substr(1));
          if (got.size() < got.find("\r\n") + 2 + len + 2) continue;
        }
        break;
      }
    }
    ok = got.starts_with(reply_prefix);
  }
  close(fd);
  if (ret_reply != nullptr) *ret_reply = got;
  return ok;
}

}  // namespace

std::string redis_server_path() { return find_on_path("REDIS_SERVER", "redis-server"); }
std::string redis_cli_path() { return find_on_path("REDIS_CLI", "redis-cli"); }

RedisProcess::RedisProcess(RedisConfig config) : config_(std::move(config)) {
  char dir[] = "/tmp/kvpark-redis-XXXXXX";
  if (mkdtemp(dir) != nullptr) directory_ = dir;
}

RedisProcess::~RedisProcess() {
  kill_hard();
  if (!directory_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(directory_, ignored);
  }
}

bool RedisProcess::start() {
  if (running() || directory_.empty()) return running();
  if (port_ > 0) return start_on(port_);  // a restart keeps its address
  for (int attempt = 0; attempt < start_attempts_max; ++attempt) {
    const int port = free_redis_port();
    if (port > 0 && start_on(port)) return true;
  }
  return false;
}

bool RedisProcess::start_on(int port) {
  const std::string server = redis_server_path();
  if (server.empty()) return false;
  std::vector<std::string> argv = {server,
                                   "--port", std::to_string(port),
                                   "--bind", "127.0.0.1",
                                   "--dir", directory_,
                                   "--save", "",
                                   "--appendonly", "no",
                                   "--daemonize", "no",
                                   "--protected-mode", "no",
                                   "--logfile", directory_ + "/redis.log"};
  if (config_.cluster) {
    argv.insert(argv.end(), {"--cluster-enabled", "yes", "--cluster-config-file",
                             directory_ + "/nodes.conf", "--cluster-node-timeout", "15000",
                             "--cluster-require-full-coverage", "no"});
  }
  if (!config_.password.empty()) argv.insert(argv.end(), {"--requirepass", config_.password});
  argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
  pid_ = spawn(argv, -1, -1, {}, /*die_with_parent=*/true);
  if (pid_ <= 0) return false;
  port_ = port;
  const std::string ping = config_.password.empty()
                               ? "PING\r\n"
                               : "AUTH " + config_.password + "\r\nPING\r\n";
  const bool ready = wait_until(
      [&] {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) {
          pid_ = -1;  // exited: the port was taken after all
          return true;
        }
        return ask(port, ping, "+");
      },
      redis_ready_msec_max);
  if (!ready || pid_ <= 0) {
    kill_hard();
    port_ = -1;
    return false;
  }
  return true;
}

void RedisProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  (void)wait_with_timeout(pid_, 10'000);
  pid_ = -1;
}

std::string RedisProcess::log_tail() const {
  std::ifstream in(directory_ + "/redis.log");
  std::stringstream s;
  s << in.rdbuf();
  const std::string text = s.str();
  return text.size() > 2000 ? text.substr(text.size() - 2000) : text;
}

std::string RedisProcess::cli(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {redis_cli_path(), "-h", "127.0.0.1", "-p", std::to_string(port_)};
  if (!config_.password.empty()) argv.insert(argv.end(), {"-a", config_.password, "--no-auth-warning"});
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  (void)run_process(argv, 10'000, &out);
  return out;
}

RedisCluster::RedisCluster(size_t masters, RedisConfig node_config) {
  node_config.cluster = true;
  for (size_t i = 0; i < masters; ++i) nodes_.push_back(std::make_unique<RedisProcess>(node_config));
}

std::string RedisCluster::seeds() const {
  std::string s = "redis://";
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (i > 0) s += ",";
    s += nodes_[i]->address();
  }
  return s;
}

bool RedisCluster::start() {
  for (auto& n : nodes_) {
    if (!n->start()) {
      failure_ = "a cluster node did not start: " + n->log_tail();
      return false;
    }
  }
  std::vector<std::string> argv = {redis_cli_path(), "--cluster", "create"};
  for (auto& n : nodes_) argv.push_back(n->address());
  argv.insert(argv.end(), {"--cluster-replicas", "0", "--cluster-yes"});
  std::string out;
  if (run_process(argv, 30'000, &out) != 0) {
    failure_ = "redis-cli --cluster create failed: " + out;
    return false;
  }
  if (!wait_ok(cluster_ok_msec_max)) {
    failure_ = "the cluster never reached cluster_state:ok";
    return false;
  }
  return true;
}

bool RedisCluster::wait_ok(int timeout_msec) {
  const std::string known = "cluster_known_nodes:" + std::to_string(nodes_.size());
  return wait_until(
      [&] {
        for (auto& n : nodes_) {
          std::string info;
          if (!ask(n->port(), "CLUSTER INFO\r\n", "$", &info)) return false;
          if (info.find("cluster_state:ok") == std::string::npos ||
              info.find(known) == std::string::npos ||
              info.find("cluster_slots_ok:16384") == std::string::npos) {
            return false;
          }
        }
        return true;
      },
      timeout_msec);
}

}  // namespace kvpark::testing
