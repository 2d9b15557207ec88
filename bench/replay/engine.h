// A modeled engine process: the replayer forks one per trace engine index. It
// serves one request at a time from its job pipe and answers each with a Result.
// Everything kvpark does is real (lookup, single-flight wait, promotion wait,
// restore copy, publish); only prefill compute is a sleep of tokens / rate,
// multiplied by the time scale. See docs/replay.md ("Engine model").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/replay/trace.h"
#include "proto/names.h"

namespace kvpark::replay {

struct EngineConfig {
  std::string socket_path;
  uint64_t namespace_low = 0x6b7670726b2d7270ull;
  uint32_t block_tokens = 64;
  uint64_t bytes_per_token = 256;                // block payload = block_tokens * this
  uint64_t snapshot_bytes = 512 * 1024;          // the recurrent state image
  uint32_t prefill_tokens_per_second = 7000;     // the modeled prefill rate
  double time_scale = 0.05;                      // real sleep = modeled time * this
  bool automatic_system_candidate = true;
  bool honour_capture_hint = true;
  uint32_t publish_chunk_tokens = 4096;          // private blocks are parked this often
  // false: an attention-only namespace (no snapshots; any block boundary restores),
  // which is what the remote tier serves today (blocks only; docs/remote.md).
  bool snapshot_required = true;
  // No engine on this host prefills what this one asks for, so tokens in flight at its
  // lookup are the remote tier's (an existence check, restores): its wait is real I/O,
  // counted unscaled (remote_ms), not a modeled single-flight wait.
  bool inflight_is_remote = false;
};

inline constexpr uint32_t published_max = 8;

struct Job {
  uint32_t request = 0;        // index into the event list
  uint64_t dispatched_nsec = 0;
};

// One request's outcome, written whole to the result pipe (fits PIPE_BUF).
struct Result {
  uint32_t request = 0;
  int32_t failed = 0;            // nonzero: error holds why
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;    // restored
  uint32_t promoting_tokens = 0; // parked on disk, still being promoted when the wait gave up
  uint32_t reuse_kind = 0;       // kvpark_reuse_kind
  uint32_t inflight_tokens = 0;  // seen at the first lookup
  uint32_t capture_hint = 0;
  uint32_t prefill_tokens = 0;
  uint8_t led = 0;               // reserved the shared head before prefilling it
  uint8_t followed = 0;          // waited for another engine's prefill
  uint8_t byte_identical = 1;
  uint8_t hint_captured = 0;
  double queue_ms = 0;           // real: dispatch to start of service
  double wait_ms = 0;            // modeled: single-flight wait (real / time scale)
  double promote_ms = 0;         // real: waiting for disk promotions
  double remote_ms = 0;          // real: waiting for remote restores (inflight_is_remote)
  double restore_ms = 0;         // real: copying the restored bytes
  double prefill_ms = 0;         // modeled: uncached tokens / rate
  double ttft_ms = 0;            // modeled: wait + promote + remote + restore + prefill
  double publish_ms = 0;         // real, off the TTFT path
  uint32_t publish_failures = 0;
  uint32_t published_count = 0;
  uint32_t published_position[published_max] = {};  // snapshots now parked (by anyone)
  uint8_t published_shared[published_max] = {};
  char error[160] = {};

  // "root", "shared_stable_prefix", "private_turn_closure" (proto/names.h).
  const char* reuse_name() const { return reuse_kind_name(ReuseKind(reuse_kind)); }
};

// Runs an engine until its job pipe closes; exits the process.
[[noreturn]] void engine_main(const EngineConfig& config, const std::vector<Event>& events,
                              uint32_t engine_index, int job_fd, int result_fd);

}  // namespace kvpark::replay
