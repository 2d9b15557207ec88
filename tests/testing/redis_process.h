// Real redis-server processes for the remote tier's tests and benchmarks: one
// Redis, or a Redis Cluster of masters, on loopback ports chosen here (a port and
// its cluster-bus port, +10000, are probed free; a start that loses the race for
// them retries on others), each in its own temporary directory, killed and removed
// with its owner. Nothing is persisted (no RDB, no AOF).
//
// Skip, don't fail, when redis-server is missing: redis_server_path() is empty then.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvpark::testing {

// redis-server and redis-cli from $REDIS_SERVER / $REDIS_CLI or the PATH; empty if absent.
std::string redis_server_path();
std::string redis_cli_path();

struct RedisConfig {
  bool cluster = false;
  std::vector<std::string> extra_args;  // e.g. {"--maxmemory", "8mb"}
  std::string password;                 // requirepass (default user)
};

class RedisProcess {
 public:
  explicit RedisProcess(RedisConfig config = {});
  ~RedisProcess();  // SIGKILLs it and removes its directory
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  // Starts on a fresh free port (or the one it had, after kill()) and waits for PING.
  bool start();
  void kill_hard();  // SIGKILL and reap; the port is kept for the next start()
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }  // SIGSTOP / SIGCONT it to play a store that hangs
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& directory() const { return directory_; }
  std::string log_tail() const;
  // One command through redis-cli (argv after the connection flags); its stdout.
  std::string cli(const std::vector<std::string>& args) const;

 private:
  bool start_on(int port);

  RedisConfig config_;
  std::string directory_;
  int port_ = -1;
  pid_t pid_ = -1;
};

// A Redis Cluster of `masters` nodes with no replicas, created with
// `redis-cli --cluster create` and waited for until every node says cluster_state:ok
// and knows every master.
class RedisCluster {
 public:
  explicit RedisCluster(size_t masters = 3, RedisConfig node_config = {});
  bool start();
  size_t size() const { return nodes_.size(); }
  RedisProcess& node(size_t i) { return *nodes_.at(i); }
  // "redis://127.0.0.1:p1,127.0.0.1:p2,..." (every node a seed).
  std::string seeds() const;
  std::string failure() const { return failure_; }

 private:
  bool wait_ok(int timeout_msec);
  std::vector<std::unique_ptr<RedisProcess>> nodes_;
  std::string failure_;
};

}  // namespace kvpark::testing
