// Write-candidate planning (DESIGN.md §5): which prefix positions of a rendered
// OpenAI-style request an engine should park, and with what evidence and class.
//
// A pure function over the rendered request's segment boundaries: no I/O, no
// allocation, no state. Input is the list of segments in render order (one per
// message, plus the tools block), each with the token offset where it ends.
// Output is at most write_candidates_max positions, strictly increasing, each
// with its evidence, entry class and the rule that picked it. The rules, and
// the precedence when there are too many, are in docs/architecture.md
// ("Write-candidate planning").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "proto/status.h"
#include "proto/types.h"

namespace kvpark::client {

// Writes one request may plan, automatic candidates included.
inline constexpr uint32_t write_candidates_max = 4;
// The shortest leading tools/system/developer head that earns an automatic candidate.
inline constexpr uint32_t system_frontier_tokens_min = 256;

enum class SegmentKind : uint8_t {
  Tools = 0,      // the tool definitions block
  System = 1,     // a system message (Responses: also `instructions`)
  Developer = 2,  // a developer message
  User = 3,
  Assistant = 4,  // an assistant turn, its tool calls included
  ToolResult = 5, // a tool (function call output) message
  Other = 6,      // anything else the renderer emits as its own span
};
inline constexpr uint8_t segment_kind_max = 6;

struct Segment {
  SegmentKind kind = SegmentKind::Other;
  uint32_t end_token = 0;            // tokens: offset in the rendered prompt where it ends
  bool explicit_breakpoint = false;  // the client marked it (prompt_cache_breakpoint, ...)
};

struct WritePlanOptions {
  bool prompt_cache_options_present = false;  // the request carried prompt_cache_options
  bool explicit_mode = false;                 // the client asked for explicit-only caching
  bool automatic_system_candidate_enabled = true;
  uint32_t total_tokens = 0;  // tokens: the whole rendered prompt; every end_token <= this
};

// Which rule picked a position (when several did, the one with the strongest evidence).
enum class CandidateReason : uint8_t {
  Explicit = 0,        // a client breakpoint
  LastContent = 1,     // the end of the last segment
  SystemFrontier = 2,  // the end of the leading tools/system/developer run
};

struct WriteCandidate {
  uint32_t position_tokens = 0;  // park the state after tokens [0, position_tokens)
  Evidence evidence = Evidence::DefaultAutomatic;
  EntryClass entry_class = EntryClass::Private;
  CandidateReason reason = CandidateReason::LastContent;

  bool operator==(const WriteCandidate&) const = default;
};

struct WritePlan {
  std::array<WriteCandidate, write_candidates_max> candidates{};  // [count], by position
  uint32_t count = 0;
  uint32_t explicit_dropped = 0;  // explicit positions over the cap (the earliest ones)
  uint32_t head_end_tokens = 0;   // tokens: end of the leading tools/system/developer run

  std::span<const WriteCandidate> view() const { return {candidates.data(), count}; }
};

// Orders evidence for merging two rules that picked the same position:
// explicit > requested automatic > engine structural > default automatic.
int evidence_strength(Evidence evidence);

// Plans the write candidates of one rendered request. Status::InvalidArgument when
// end_token decreases from one segment to the next, exceeds total_tokens, or a kind
// is out of range; ret_plan is untouched then. Never fails otherwise.
Status plan_write_candidates(std::span<const Segment> segments, const WritePlanOptions& options,
                             WritePlan* ret_plan);

}  // namespace kvpark::client
