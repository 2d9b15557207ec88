// An upstream that fails on cue, for kvpark-proxy's fault tests (faults_test.cpp): a
// relay in the test process in front of a real llama-server. Every request is
// passed to llama-server and its answer back, whole, except the next request to a
// path a fault is armed for, which gets the fault instead of (or after) its answer.
// It remembers the last body sent to each path: what the proxy really forwarded.
#pragma once

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace kvpark::testing {

enum class UpstreamFault {
  none,
  truncate,    // llama-server's status and headers, half its body, then the connection closes
  deep_ok,     // 200 with a body of deep_fault_levels "[" (a usage event when streamed)
  deep_error,  // 500 with that body
  hold,        // nothing at all, until release() or hold_timeout_sec: a long generation
               // of a reply that is not streamed, of which llama-server sends nothing
};

inline constexpr time_t hold_timeout_sec = 120;

// Nesting of the deep replies: far past any stack a recursive parser has.
inline constexpr size_t deep_fault_levels = 200'000;

class FaultUpstream {
 public:
  explicit FaultUpstream(std::string llama_server_url);
  ~FaultUpstream();
  FaultUpstream(const FaultUpstream&) = delete;
  FaultUpstream& operator=(const FaultUpstream&) = delete;

  bool start();  // listens on a free 127.0.0.1 port
  std::string url() const;
  // The next request to `path` (no query) gets `fault`; later ones are relayed.
  void arm(const std::string& path, UpstreamFault fault);
  // Faults delivered so far (a hold counts from its start).
  int delivered() const { return delivered_.load(); }
  // Ends every hold: the held requests go on to llama-server.
  void release();
  // The body of the last request to `path` (no query); "" when none came.
  std::string last_body(const std::string& path);

 private:
  void relay(const httplib::Request& req, httplib::Response& res);
  UpstreamFault take_fault(const std::string& path);

  const std::string target_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
  std::mutex mutex_;
  std::map<std::string, UpstreamFault> armed_;  // path -> fault
  std::map<std::string, std::string> last_bodies_;  // path -> the last request's body
  std::condition_variable released_changed_;
  bool released_ = false;
  std::atomic<int> delivered_{0};
};

}  // namespace kvpark::testing
