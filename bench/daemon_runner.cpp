// Starting, stopping and inspecting the bench's own kvparkd (see daemon_runner.h).
#include "bench/daemon_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "bench/bench.h"

namespace kvpark::bench {
namespace {

// The daemon commits every arena page before it accepts: a large arena takes a while,
// longer on a busy machine.
constexpr uint64_t start_timeout_nsec = 30'000'000'000;
constexpr uint64_t start_timeout_nsec_per_gib = 15'000'000'000;
constexpr uint64_t stop_timeout_nsec = 10'000'000'000;

std::atomic<int> instance_counter{0};

bool executable(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0;
}

// Flags that keep a bench daemon off shared resources (HTTP port, bus name, disk
// directory) a system kvparkd may hold; passed only when this kvparkd knows them.
std::vector<std::string> isolation_flags(const std::string& kvparkd) {
  std::string help;
  if (FILE* p = popen(("'" + kvparkd + "' --help 2>/dev/null").c_str(), "r"); p != nullptr) {
    char buffer[4096];
    size_t n;
    while ((n = fread(buffer, 1, sizeof buffer, p)) > 0) help.append(buffer, n);
    pclose(p);
  }
  std::vector<std::string> flags;
  for (const char* name : {"--http-listen", "--dbus", "--disk-dir"}) {
    if (help.find(name) != std::string::npos) flags.insert(flags.end(), {name, "off"});
  }
  return flags;
}

}  // namespace

std::string find_kvparkd(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("KVPARKD"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::vector<std::filesystem::path> candidates;
  if (!ec) {
    const std::filesystem::path dir = self.parent_path();
    candidates = {dir / "kvparkd", dir / ".." / "daemon" / "kvparkd", dir / ".." / "sbin" / "kvparkd"};
  }
#ifdef KVPARK_BENCH_SBINDIR
  candidates.emplace_back(std::filesystem::path(KVPARK_BENCH_SBINDIR) / "kvparkd");
#endif
#ifdef KVPARK_BENCH_KVPARKD
  candidates.emplace_back(KVPARK_BENCH_KVPARKD);
#endif
  for (const auto& c : candidates) {
    if (executable(c)) return std::filesystem::weakly_canonical(c, ec).string();
  }
  return "";
}

uint64_t read_rss_anon_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::strtoull(line.c_str() + 8, nullptr, 10);
  }
  return 0;
}

BenchDaemon::~BenchDaemon() {
  if (pid_ > 0 && !stop()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  cleanup();
}

void BenchDaemon::cleanup() {
  if (!arena_name_.empty()) shm_unlink(arena_name_.c_str());  // the daemon's own, if it crashed
  if (!directory_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(directory_, ec);
  }
  arena_name_.clear();
  directory_.clear();
}

bool BenchDaemon::start(const DaemonSpec& spec, std::string& ret_error) {
  char templ[] = "/tmp/kvpark-bench-XXXXXX";
  if (mkdtemp(templ) == nullptr) {
    ret_error = std::string("mkdtemp: ") + strerror(errno);
    return false;
  }
  directory_ = templ;
  socket_path_ = directory_ + "/kvparkd.sock";
  log_path_ = directory_ + "/kvparkd.log";
  arena_name_ = "/kvpark-bench-" + std::to_string(getpid()) + "-" +
                std::to_string(instance_counter++);
  std::vector<std::string> argv = {spec.kvparkd, "--socket", socket_path_, "--arena-name",
                                   arena_name_, "--arena-size", std::to_string(spec.arena_bytes)};
  if (!spec.huge_pages.empty()) argv.insert(argv.end(), {"--huge-pages", spec.huge_pages});
  if (spec.reservation_bytes_max != 0) {
    argv.insert(argv.end(), {"--reservation-max", std::to_string(spec.reservation_bytes_max)});
  }
  const std::vector<std::string> isolation = isolation_flags(spec.kvparkd);
  argv.insert(argv.end(), isolation.begin(), isolation.end());
  const uint64_t timeout_nsec = start_timeout_nsec + spec.arena_bytes / (1ull << 30) * start_timeout_nsec_per_gib;
  return spawn_daemon(argv, log_path_, /*append=*/false, socket_path_, timeout_nsec, pid_, ret_error);
}


bool socket_accepts(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

std::string log_tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  return s.size() > 2000 ? s.substr(s.size() - 2000) : s;
}

bool spawn_daemon(std::vector<std::string> argv, const std::string& log_path, bool append,
                  const std::string& socket_path, uint64_t timeout_nsec, pid_t& ret_pid,
                  std::string& ret_error) {
  std::vector<char*> args;
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const int log_fd = open(log_path.c_str(),
                          O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (log_fd >= 0) {
      dup2(log_fd, STDOUT_FILENO);
      dup2(log_fd, STDERR_FILENO);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  if (log_fd >= 0) close(log_fd);
  ret_pid = pid;
  if (pid < 0) {
    ret_error = std::string("fork: ") + strerror(errno);
    return false;
  }
  const uint64_t deadline = now_nsec() + timeout_nsec;
  while (now_nsec() < deadline) {
    if (socket_accepts(socket_path)) return true;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      ret_pid = -1;
      ret_error = "kvparkd (" + argv[0] + ") exited at start:\n" + log_tail(log_path);
      return false;
    }
    usleep(2000);
  }
  ret_error = "kvparkd did not accept connections in time:\n" + log_tail(log_path);
  return false;
}

bool BenchDaemon::stop() {
  if (pid_ <= 0) return true;
  kill(pid_, SIGTERM);
  const uint64_t deadline = now_nsec() + stop_timeout_nsec;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!clean) {
        fprintf(stderr, "kvpark-bench: kvparkd exited with status %d; its log:\n%s\n", status,
                log_tail(log_path_).c_str());
      }
      cleanup();
      return clean;
    }
    if (now_nsec() >= deadline) return false;
    usleep(2000);
  }
}

}  // namespace kvpark::bench
