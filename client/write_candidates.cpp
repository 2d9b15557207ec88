// Write-candidate planning: see write_candidates.h and docs/architecture.md.
//
// Steps: validate the boundaries; find the head (the leading tools/system/developer
// run); keep the latest write_candidates_max distinct explicit positions; add the
// automatic candidates (system frontier, then last content) into the slots left,
// merging any that land on an already chosen position; sort by position. The
// class of a position follows from where it lies: inside the head it is shared.
#include "client/write_candidates.h"

#include <utility>
#include <cassert>

namespace kvpark::client {
namespace {

bool is_head_kind(SegmentKind kind) {
  return kind == SegmentKind::Tools || kind == SegmentKind::System ||
         kind == SegmentKind::Developer;
}

struct Builder {
  WritePlan plan;

  // Adds a candidate, or merges it into the one already at that position.
  // Returns false when a new slot was needed and none was left.
  bool add(uint32_t position, Evidence evidence, CandidateReason reason, uint32_t head_end) {
    assert(position > 0);
    for (uint32_t i = 0; i < plan.count; ++i) {
      WriteCandidate& c = plan.candidates[i];
      if (c.position_tokens != position) continue;
      if (evidence_strength(evidence) > evidence_strength(c.evidence)) {
        c.evidence = evidence;
        c.reason = reason;
      }
      return true;
    }
    if (plan.count == write_candidates_max) return false;
    plan.candidates[plan.count++] = WriteCandidate{
        .position_tokens = position,
        .evidence = evidence,
        .entry_class = position <= head_end ? EntryClass::Shared : EntryClass::Private,
        .reason = reason,
    };
    return true;
  }
};

}  // namespace

int evidence_strength(Evidence evidence) {
  switch (evidence) {
    case Evidence::DefaultAutomatic: return 0;
    case Evidence::EngineStructural: return 1;
    case Evidence::RequestedAutomatic: return 2;
    case Evidence::ObservedRecurrence: return 1;  // never produced here; as structural
    case Evidence::ExplicitBreakpoint: return 3;
  }
  assert(false && "evidence out of range");
  return 0;
}

Status plan_write_candidates(std::span<const Segment> segments, const WritePlanOptions& options,
                             WritePlan* ret_plan) {
  assert(ret_plan != nullptr);
  uint32_t previous_end = 0;
  for (const Segment& s : segments) {
    if (static_cast<uint8_t>(s.kind) > segment_kind_max) return Status::InvalidArgument;
    if (s.end_token < previous_end) return Status::InvalidArgument;
    if (s.end_token > options.total_tokens) return Status::InvalidArgument;
    previous_end = s.end_token;
  }

  uint32_t head_end = 0;
  for (const Segment& s : segments) {
    if (!is_head_kind(s.kind)) break;
    head_end = s.end_token;
  }

  Builder builder;
  builder.plan.head_end_tokens = head_end;

  // Explicit marks, latest first: the latest write_candidates_max distinct positions win.
  uint32_t explicit_total = 0;
  uint32_t last_position = 0;
  for (size_t i = segments.size(); i-- > 0;) {
    const Segment& s = segments[i];
    if (!s.explicit_breakpoint || s.end_token == 0 || s.end_token == last_position) continue;
    last_position = s.end_token;
    ++explicit_total;
    builder.add(s.end_token, Evidence::ExplicitBreakpoint, CandidateReason::Explicit, head_end);
  }
  builder.plan.explicit_dropped =
      explicit_total > write_candidates_max ? explicit_total - write_candidates_max : 0;

  if (!options.explicit_mode) {
    // The shared head outranks this request's private continuation for the last slot.
    // A frontier the client marked already merges into its explicit candidate.
    if (options.automatic_system_candidate_enabled && head_end >= system_frontier_tokens_min) {
      builder.add(head_end, Evidence::EngineStructural, CandidateReason::SystemFrontier,
                  head_end);
    }
    if (!segments.empty() && segments.back().end_token > 0) {
      const Evidence evidence = options.prompt_cache_options_present
                                    ? Evidence::RequestedAutomatic
                                    : Evidence::DefaultAutomatic;
      builder.add(segments.back().end_token, evidence, CandidateReason::LastContent, head_end);
    }
  }

  WritePlan& plan = builder.plan;
  for (uint32_t i = 1; i < plan.count; ++i) {  // insertion sort of at most 4
    for (uint32_t j = i; j > 0 && plan.candidates[j].position_tokens <
                                      plan.candidates[j - 1].position_tokens; --j) {
      std::swap(plan.candidates[j], plan.candidates[j - 1]);
    }
  }
  for (uint32_t i = 1; i < plan.count; ++i) {
    assert(plan.candidates[i - 1].position_tokens < plan.candidates[i].position_tokens);
  }
  *ret_plan = plan;
  return Status::Ok;
}

}  // namespace kvpark::client
