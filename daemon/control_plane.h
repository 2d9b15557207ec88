// Control (control.h) implemented over the daemon core, every call run on the
// event loop through LoopQueue.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "daemon/adoption.h"
#include "daemon/control.h"
#include "daemon/entry_table.h"
#include "daemon/loop_queue.h"
#include "daemon/park.h"

namespace kvpark::daemon {

struct ControlPlaneOptions {
  std::string version;
  std::string socket_path;
  uint64_t incarnation = 0;
  uint64_t start_usec = 0;  // CLOCK_MONOTONIC
  std::string arena_pages;  // "hugetlb", "thp" or "4k"
  uint64_t arena_page_bytes = 0;
  // Re-reads the configuration file and applies what can change at run time
  // (loop thread); empty when the daemon runs without a file.
  std::function<Status(std::string& ret_message)> reload;
  // A set-limit that took effect (loop thread): the daemon logs it and keeps it.
  std::function<void(const LimitChange&)> limit_changed;
  // Why a configured disk tier is not serving; empty when it serves or none is configured.
  std::string disk_failure;
  AdoptionReport adoption;         // adopted == false: the arena was made new
  std::string fresh_start_reason;  // why kept fds were not adopted

};

class ControlPlane final : public Control {
 public:
  ControlPlane(ControlPlaneOptions options, Park& park, EntryTable& table, LoopQueue& loop);

  StatusInfo status() override;
  std::vector<NamespaceSummary> namespaces() override;
  std::vector<EntrySummary> entries(const EntryFilter& filter, uint64_t& ret_total) override;
  Status entry(uint64_t id, EntrySummary& ret_entry) override;
  Status pin(uint64_t id, bool pinned) override;
  Status evict(uint64_t id, std::string& ret_message) override;
  Status drop_namespace(const NamespaceId& id, uint64_t& ret_dropped) override;
  HealthInfo health() override;
  Status set_limit(const std::string& name, uint64_t value, const std::string& caller,
                   std::string& ret_message) override;
  Status start_flush(uint64_t& ret_job_id) override;
  Status flush_progress(uint64_t job_id, FlushProgress& ret_progress) override;
  Status reload_config(std::string& ret_message) override;

  // Loop thread only: the same snapshot status() returns (for in-loop users).
  StatusInfo status_in_loop() const;
  // main: true once READY=1 is sent, false again when stopping starts (any thread).
  void set_serving(bool serving) { serving_ = serving; stopped_ = stopped_ || !serving; }

 private:
  EntrySummary summarize(EntrySlot slot, uint64_t now_usec) const;
  // Loop thread: sets a limit check_runtime_limit() accepted.
  Status apply_limit(const std::string& name, uint64_t value, uint64_t& ret_old_value);

  ControlPlaneOptions options_;
  Park& park_;
  EntryTable& table_;
  LoopQueue& loop_;
  std::atomic<bool> serving_{false};
  std::atomic<bool> stopped_{false};  // was serving once: "stopping", not "starting"
};

}  // namespace kvpark::daemon
