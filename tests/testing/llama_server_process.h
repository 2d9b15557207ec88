// A real llama-server and a real kvpark-proxy for end-to-end tests and the proxy
// bench: each a child process on its own 127.0.0.1 port, its log in a file, started
// and stopped (or killed) by the caller. Ports are picked free at start and kept
// across a restart, so a proxy's upstream URL stays valid; a picked port another
// process took before the child bound it makes the child exit, and start() tries
// a fresh one (neither binary reports a port it bound itself).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tests/testing/daemon_process.h"

namespace kvpark::testing {

struct LlamaServerConfig {
  std::string binary;                   // llama-server
  std::string model;                    // GGUF path
  std::string slot_dir;                 // --slot-save-path, passed with a trailing slash
                                        // ("": not passed, slot actions disabled)
  int slots = 4;                        // -np
  int context_tokens = 32768;           // -c, all slots together
  int threads = 2;                      // -t
  std::vector<std::string> extra_args;  // e.g. {"-ctk", "q8_0"}
};

class LlamaServerProcess {
 public:
  // Output (stdout and stderr) is appended to `log_path`.
  LlamaServerProcess(LlamaServerConfig config, std::string log_path);
  ~LlamaServerProcess();  // SIGKILLs a server still running
  LlamaServerProcess(const LlamaServerProcess&) = delete;
  LlamaServerProcess& operator=(const LlamaServerProcess&) = delete;

  // Starts on `port` (0: the previous port, or a free one) and waits until GET
  // /health answers 200; false if the server exits or is not ready in time.
  bool start(int port = 0);
  // SIGTERM and wait; the exit status (as from waitpid), -1 on timeout (then killed).
  int stop();
  void kill_hard();  // SIGKILL and reap
  bool running() const { return pid_ > 0; }

  LlamaServerConfig& config() { return config_; }  // takes effect at the next start()
  int port() const { return port_; }
  std::string url() const;  // http://127.0.0.1:PORT
  const std::string& log_path() const { return log_path_; }
  std::string log_tail(size_t bytes_max = 4000) const;

 private:
  LlamaServerConfig config_;
  std::string log_path_;
  int port_ = 0;
  pid_t pid_ = -1;
};

struct ProxyUpstream {
  std::string name;  // the model name clients send
  std::string url;   // http://127.0.0.1:PORT
};

struct ProxyConfig {
  std::string binary;  // kvpark-proxy
  std::vector<ProxyUpstream> upstreams;
  std::string slot_dir;        // the upstreams' --slot-save-path, without the slash
  std::string kvparkd_socket;  // --socket
  std::vector<std::string> extra_args;
  // The stdout line start() waits for: "ready" once every upstream is verified,
  // "kvpark-proxy: listening" to start one in front of a misconfigured upstream.
  std::string ready_line = "kvpark-proxy: ready";
};

class ProxyProcess {
 public:
  // stderr (one line per request) is appended to `log_path`.
  ProxyProcess(ProxyConfig config, std::string log_path);
  ~ProxyProcess();  // SIGKILLs a proxy still running
  ProxyProcess(const ProxyProcess&) = delete;
  ProxyProcess& operator=(const ProxyProcess&) = delete;

  // Starts on `port` (0: the previous port, or a free one) and waits for the line
  // config.ready_line on stdout; false if it does not come in time.
  bool start(int port = 0);
  // SIGTERM and wait: the exit code (128 + signal if killed by one), -1 on timeout.
  int stop();
  void kill_hard();
  bool running() const { return child_.has_value() && child_->pid > 0; }

  ProxyConfig& config() { return config_; }  // takes effect at the next start()
  int port() const { return port_; }
  std::string url() const;
  const std::string& log_path() const { return log_path_; }
  std::string log_tail(size_t bytes_max = 4000) const;

 private:
  ProxyConfig config_;
  std::string log_path_;
  int port_ = 0;
  std::optional<ChildProcess> child_;  // stdout on a pipe, read until "ready"
};

// Runs kvpark-make-test-model: a text-only-output model at `path` (embedding 0: the
// tool's default width; arch "": its default family); false on failure.
bool make_test_model(const std::string& make_test_model_binary, const std::string& path,
                     int seed = 1, int embedding = 0, const std::string& arch = "");

// The last `bytes_max` bytes of a file ("" if it cannot be read).
std::string file_tail(const std::string& path, size_t bytes_max);

}  // namespace kvpark::testing
