// Child processes for the proxy's end-to-end tests (see llama_server_process.h).
#include "tests/testing/llama_server_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/testing/openai_http.h"
#include "tests/testing/wait.h"

extern char** environ;

namespace kvpark::testing {
namespace {

constexpr int llama_server_ready_msec_max = 120'000;  // model load + warmup on a busy box
constexpr int proxy_ready_msec_max = 60'000;
constexpr int stop_msec_max = 15'000;
constexpr int port_attempts_max = 3;            // fresh ports tried when a picked one was taken
constexpr int exit_after_eof_msec_max = 5'000;  // a child that closed its stdout is exiting

int open_log(const std::string& path) {
  return open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

void append_log(const std::string& path, const std::string& line) {
  std::ofstream(path, std::ios::app) << line << '\n';
}

std::string join(const std::vector<std::string>& argv) {
  std::string out;
  for (const std::string& a : argv) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

std::string file_tail(const std::string& path, size_t bytes_max) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string all = buffer.str();
  return all.size() <= bytes_max ? all : all.substr(all.size() - bytes_max);
}

bool make_test_model(const std::string& make_test_model_binary, const std::string& path, int seed,
                     int embedding, const std::string& arch) {
  std::vector<std::string> argv = {make_test_model_binary, path, "--seed", std::to_string(seed),
                                   "--text-only-output",   "1"};
  if (embedding > 0) argv.insert(argv.end(), {"--embedding", std::to_string(embedding)});
  if (!arch.empty()) argv.insert(argv.end(), {"--arch", arch});
  std::string out;
  return run_process(argv, 60'000, &out) == 0;
}

LlamaServerProcess::LlamaServerProcess(LlamaServerConfig config, std::string log_path)
    : config_(std::move(config)), log_path_(std::move(log_path)) {}

LlamaServerProcess::~LlamaServerProcess() {
  kill_hard();
}

std::string LlamaServerProcess::url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

std::string LlamaServerProcess::log_tail(size_t bytes_max) const {
  return file_tail(log_path_, bytes_max);
}

bool LlamaServerProcess::start(int port) {
  if (pid_ > 0) return false;
  if (port != 0) port_ = port;
  // A port picked here was free a moment ago; if another process took it since,
  // the server exits at bind and a fresh port is tried.
  const bool picked = port_ == 0;
  for (int attempt = 0; attempt < port_attempts_max; ++attempt) {
    if (picked) port_ = free_tcp_port();
    std::vector<std::string> argv = {config_.binary,
                                     "-m",
                                     config_.model,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(port_),
                                     "-np",
                                     std::to_string(config_.slots),
                                     "-c",
                                     std::to_string(config_.context_tokens),
                                     "-t",
                                     std::to_string(config_.threads),
                                     "--metrics",
                                     "--no-webui"};
    if (!config_.slot_dir.empty()) argv.insert(argv.end(), {"--slot-save-path", config_.slot_dir + "/"});
    argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
    append_log(log_path_, "=== " + join(argv));
    const int log_fd = open_log(log_path_);
    pid_ = spawn(argv, log_fd, log_fd);
    close(log_fd);
    if (pid_ <= 0) return false;
    bool exited = false;
    const auto alive = [&] {
      int status = 0;
      exited = exited || waitpid(pid_, &status, WNOHANG) == pid_;
      return !exited;
    };
    // Healthy, and still alive after answering: the answer was this server's, not
    // another one's that holds the port.
    const bool ready = wait_until(
        [&] {
          return !alive() ||
                 (http_get(url(), "/health", /*timeout_msec=*/2000).status == 200 && alive());
        },
        llama_server_ready_msec_max);
    if (ready && !exited) return true;
    if (!exited) {
      kill_hard();
      return false;
    }
    pid_ = -1;
    if (!picked) return false;
  }
  return false;
}

int LlamaServerProcess::stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const int status = wait_with_timeout(pid_, stop_msec_max);
  if (status == -1) kill_hard();
  pid_ = -1;
  return status;
}

void LlamaServerProcess::kill_hard() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
}

ProxyProcess::ProxyProcess(ProxyConfig config, std::string log_path)
    : config_(std::move(config)), log_path_(std::move(log_path)) {}

ProxyProcess::~ProxyProcess() {
  kill_hard();
}

std::string ProxyProcess::url() const {
  return "http://127.0.0.1:" + std::to_string(port_);
}

std::string ProxyProcess::log_tail(size_t bytes_max) const {
  return file_tail(log_path_, bytes_max);
}

bool ProxyProcess::start(int port) {
  if (running()) return false;
  if (port != 0) port_ = port;
  const bool picked = port_ == 0;  // as for llama-server: a taken port gets a fresh one
  for (int attempt = 0; attempt < port_attempts_max; ++attempt) {
    if (picked) port_ = free_tcp_port();
    std::vector<std::string> argv = {config_.binary, "--listen",
                                     "127.0.0.1:" + std::to_string(port_)};
    for (const ProxyUpstream& u : config_.upstreams) {
      argv.push_back("--upstream");
      argv.push_back(u.name + "=" + u.url);
    }
    argv.insert(argv.end(), {"--slot-dir", config_.slot_dir, "--socket", config_.kvparkd_socket});
    argv.insert(argv.end(), config_.extra_args.begin(), config_.extra_args.end());
    append_log(log_path_, "=== " + join(argv));

    int pipe_fds[2];
    if (pipe2(pipe_fds, O_CLOEXEC) != 0) return false;
    const int log_fd = open_log(log_path_);
    child_.reset();
    child_.emplace();
    child_->pid = spawn(argv, pipe_fds[1], log_fd);
    child_->stdout_fd = pipe_fds[0];
    close(pipe_fds[1]);
    close(log_fd);
    if (child_->pid <= 0) {
      child_.reset();
      return false;
    }
    if (child_->wait_for_line(config_.ready_line, proxy_ready_msec_max)) return true;
    // Exited before "ready" (its stdout closed): maybe the port; else it hangs.
    const bool exited = wait_with_timeout(child_->pid, exit_after_eof_msec_max) != -1;
    if (exited) child_->pid = -1;
    kill_hard();
    if (!exited || !picked) return false;
  }
  return false;
}

int ProxyProcess::stop() {
  if (!running()) return -1;
  ::kill(child_->pid, SIGTERM);
  const int code = child_->wait_exit(stop_msec_max);
  child_.reset();  // closes the pipe
  return code;
}

void ProxyProcess::kill_hard() {
  child_.reset();
}  // ~ChildProcess: SIGKILL, reap, close

}  // namespace kvpark::testing
