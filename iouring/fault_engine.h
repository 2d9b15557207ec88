// IoEngine wrapper that fails chosen operations, for tests (STYLE.md §9).
//
// A rule picks operations by kind, by path substring of the file they touch, by ordinal
// (the nth matching op) or by seeded chance, and injects an errno (-EIO, -ENOSPC, -EINTR,
// ...) without touching the file, or a short transfer: the op is passed on with half its
// length (rounded down to the 4 KiB O_DIRECT unit), so the file really is partly written.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "iouring/io_engine.h"

namespace kvpark::disk {

struct FaultRule {
  enum class Action : uint8_t { Error, ShortTransfer };
  IoOp op = IoOp::Write;
  bool any_op = false;        // match every kind
  std::string path_contains;  // empty: any file
  uint64_t nth = 0;           // 1-based ordinal among matching ops; 0: every matching op
  double probability = 1.0;   // per matching op, drawn from the engine's seeded generator
  uint64_t times = 1;         // how often the rule fires; 0: unlimited
  Action action = Action::Error;
  int error = 5;              // errno for Action::Error (EIO)
};

class FaultInjectingEngine final : public IoEngine {
 public:
  FaultInjectingEngine(std::unique_ptr<IoEngine> inner, uint64_t seed);
  void add_rule(const FaultRule& rule);
  void clear_rules() { rules_.clear(); }
  uint64_t faults_injected() const { return injected_; }
  IoEngine& inner() { return *inner_; }

  bool submit(const IoRequest& request) override;
  int flush() override { return inner_->flush(); }
  int wait(std::vector<IoCompletion>& ret, unsigned min_complete) override;
  unsigned queue_depth() const override { return inner_->queue_depth(); }
  unsigned in_flight() const override { return inner_->in_flight() + static_cast<unsigned>(synthetic_.size()); }
  int fixed_buffer_index(const void* buffer, uint64_t bytes) const override {
    return inner_->fixed_buffer_index(buffer, bytes);
  }

 private:
  struct RuleState {
    FaultRule rule;
    uint64_t matched = 0;
    uint64_t fired = 0;
  };
  const FaultRule* pick(const IoRequest& request);
  std::unique_ptr<IoEngine> inner_;
  std::mt19937_64 random_;
  std::vector<RuleState> rules_;
  std::vector<IoCompletion> synthetic_;  // injected errors, delivered at the next wait
  uint64_t injected_ = 0;
};

}  // namespace kvpark::disk
