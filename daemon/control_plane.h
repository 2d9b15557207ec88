// Control (control.h) implemented over the daemon core, every call run on the
// event loop through LoopQueue.
#pragma once

#include <functional>
#include <string>

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
  Status set_limit(const std::string& name, uint64_t value, std::string& ret_message) override;
  Status start_flush(uint64_t& ret_job_id) override;
  Status flush_progress(uint64_t job_id, FlushProgress& ret_progress) override;
  Status reload_config(std::string& ret_message) override;

  // Loop thread only: the same snapshot status() returns (for in-loop users).
  StatusInfo status_in_loop() const;

 private:
  EntrySummary summarize(EntrySlot slot, uint64_t now_usec) const;
  // Loop thread: sets a limit check_runtime_limit() accepted.
  Status apply_limit(const std::string& name, uint64_t value);

  ControlPlaneOptions options_;
  Park& park_;
  EntryTable& table_;
  LoopQueue& loop_;
};

}  // namespace kvpark::daemon
