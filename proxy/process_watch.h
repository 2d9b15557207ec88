// Whether an upstream is still the process the proxy last checked, without asking
// it: one idle TCP connection to it is held as a witness. A process that exits or
// restarts closes every socket it holds, so a witness that is still open proves the
// process is the one verified (its model, build and slot contents as the proxy
// knows them), for the cost of one non-blocking recv(). llama-server closes an idle
// connection after its keep-alive timeout (5 s); renew() hands over to a new witness
// before then, and proves continuity by checking that the old one outlived the new
// one's connect. A witness is armed before the process is checked (a restart during
// the check closes it) but vouches only once the caller says the check passed
// (trust()): until then another thread asking gets false and checks for itself.
#pragma once

#include <mutex>
#include <string>

namespace kvpark::proxy {

class ProcessWatch {
 public:
  explicit ProcessWatch(std::string url);
  ~ProcessWatch();
  ProcessWatch(const ProcessWatch&) = delete;
  ProcessWatch& operator=(const ProcessWatch&) = delete;

  // True while a trusted witness is open: the process is the one it was connected to
  // at arm() (or before an unbroken chain of renew()), and was checked since.
  bool same_process();
  // Connects a new witness, not yet trusted, to whatever listens now; the caller
  // checks the process, then trust()s it. false: no connection (the caller then
  // checks the upstream itself every time).
  bool arm();
  // The check of the process arm() connected to passed: the witness vouches for it.
  void trust();
  // A new witness, proven to reach the same process as the old one. false: the old
  // one had closed (the process may have changed; the caller verifies, then arm()).
  bool renew();
  void disarm();

 private:
  int connect_witness() const;
  static bool open(int fd);

  std::string host_;
  std::string port_;
  std::mutex mutex_;
  int fd_ = -1;
  bool trusted_ = false;  // the process fd_ reaches was checked after fd_ connected
};

}  // namespace kvpark::proxy
