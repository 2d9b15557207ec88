#include "iouring/fault_engine.h"

#include <unistd.h>

#include <cassert>

#include "iouring/disk_limits.h"

namespace kvpark::disk {

namespace {
std::string fd_path(int fd) {
  char link[64];
  char target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : std::string();
}
}  // namespace

FaultInjectingEngine::FaultInjectingEngine(std::unique_ptr<IoEngine> inner, uint64_t seed)
    : inner_(std::move(inner)), random_(seed) {}

void FaultInjectingEngine::add_rule(const FaultRule& rule) { rules_.push_back(RuleState{rule}); }

const FaultRule* FaultInjectingEngine::pick(const IoRequest& request) {
  std::string path;
  for (RuleState& s : rules_) {
    const FaultRule& r = s.rule;
    if (!r.any_op && r.op != request.op) continue;
    if (!r.path_contains.empty()) {
      if (path.empty()) path = fd_path(request.fd);
      if (path.find(r.path_contains) == std::string::npos) continue;
    }
    ++s.matched;
    if (r.nth != 0 && s.matched != r.nth) continue;
    if (r.times != 0 && s.fired >= r.times) continue;
    if (r.probability < 1.0 && std::uniform_real_distribution<double>(0, 1)(random_) >= r.probability) continue;
    if (r.action == FaultRule::Action::ShortTransfer && (request.op == IoOp::Fsync || request.bytes < 2 * io_align_bytes))
      continue;  // nothing shorter that O_DIRECT could do
    ++s.fired;
    return &r;
  }
  return nullptr;
}

bool FaultInjectingEngine::submit(const IoRequest& request) {
  if (in_flight() >= queue_depth()) return false;
  const FaultRule* rule = pick(request);
  if (rule == nullptr) return inner_->submit(request);
  ++injected_;
  if (rule->action == FaultRule::Action::Error) {
    synthetic_.push_back(IoCompletion{request.tag, -static_cast<int64_t>(rule->error)});
    return true;
  }
  IoRequest shorter = request;
  shorter.bytes = request.bytes / 2 / io_align_bytes * io_align_bytes;
  return inner_->submit(shorter);
}

int FaultInjectingEngine::wait(std::vector<IoCompletion>& ret, unsigned min_complete) {
  int count = static_cast<int>(synthetic_.size());
  ret.insert(ret.end(), synthetic_.begin(), synthetic_.end());
  synthetic_.clear();
  unsigned still = min_complete > static_cast<unsigned>(count) ? min_complete - count : 0;
  if (still > inner_->in_flight()) still = inner_->in_flight();
  int rc = inner_->wait(ret, still);
  if (rc < 0) return rc;
  return count + rc;
}

}  // namespace kvpark::disk
