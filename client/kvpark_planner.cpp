// The C ABI over the write-candidate planner and request parser (kvpark_planner.h):
// a thin translation layer; the rules live in write_candidates.cpp.
#include "client/kvpark_planner.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "client/c_boundary.h"
#include "client/openai_request.h"
#include "client/write_candidates.h"

struct kvpark_request {
  kvpark::client::ParsedRequest parsed;
};

namespace kvpark::client {
namespace {

static_assert(KVPARK_WRITE_CANDIDATES_MAX == write_candidates_max);
static_assert(KVPARK_SYSTEM_FRONTIER_TOKENS_MIN == system_frontier_tokens_min);
static_assert(KVPARK_SEGMENT_OTHER == static_cast<int>(SegmentKind::Other));
static_assert(KVPARK_SEGMENT_TOOL_RESULT == static_cast<int>(SegmentKind::ToolResult));
static_assert(KVPARK_SEGMENT_TOOLS == static_cast<int>(SegmentKind::Tools));
static_assert(KVPARK_EVIDENCE_EXPLICIT_BREAKPOINT == static_cast<int>(Evidence::ExplicitBreakpoint));
static_assert(KVPARK_EVIDENCE_ENGINE_STRUCTURAL == static_cast<int>(Evidence::EngineStructural));
static_assert(KVPARK_EVIDENCE_REQUESTED_AUTOMATIC == static_cast<int>(Evidence::RequestedAutomatic));
static_assert(KVPARK_EVIDENCE_DEFAULT_AUTOMATIC == static_cast<int>(Evidence::DefaultAutomatic));
static_assert(KVPARK_CLASS_SHARED == static_cast<int>(EntryClass::Shared));
static_assert(KVPARK_CLASS_PRIVATE == static_cast<int>(EntryClass::Private));
static_assert(KVPARK_CANDIDATE_SYSTEM_FRONTIER == static_cast<int>(CandidateReason::SystemFrontier));
static_assert(KVPARK_CANDIDATE_LAST_CONTENT == static_cast<int>(CandidateReason::LastContent));
static_assert(KVPARK_TOOLS_NOT_RENDERED == static_cast<int>(ToolsPlacement::NotRendered));
static_assert(KVPARK_REQUEST_RESPONSES == static_cast<int>(RequestApi::Responses));

kvpark_status to_c(Status status) { return static_cast<kvpark_status>(status); }

// The raw value of an enum a C caller passed: C lets it hold any int, while in C++
// loading an out-of-range value of an unfixed enum is undefined, so read the bytes.
template <typename Enum>
int64_t raw_value(const Enum& value) {
  std::underlying_type_t<Enum> raw;
  static_assert(sizeof raw == sizeof value);
  std::memcpy(&raw, &value, sizeof raw);
  return static_cast<int64_t>(raw);
}

}  // namespace
}  // namespace kvpark::client

using namespace kvpark::client;

// The C boundary (client/c_boundary.h): every body that can throw catches.
extern "C" {

kvpark_status kvpark_plan_write_candidates(const kvpark_segment* segments, size_t n_segments,
                                           const kvpark_write_plan_options* options,
                                           kvpark_write_candidate* ret_candidates,
                                           size_t* ret_count) try {
  if ((segments == nullptr && n_segments > 0) || options == nullptr ||
      ret_candidates == nullptr || ret_count == nullptr) {
    return KVPARK_INVALID_ARGUMENT;
  }
  std::vector<Segment> input;
  input.reserve(n_segments);
  for (size_t i = 0; i < n_segments; ++i) {
    const int64_t kind = raw_value(segments[i].kind);
    if (kind < 0 || kind > segment_kind_max) return KVPARK_INVALID_ARGUMENT;
    input.push_back(Segment{.kind = static_cast<SegmentKind>(kind),
                            .end_token = segments[i].end_token,
                            .explicit_breakpoint = segments[i].explicit_breakpoint != 0});
  }
  const WritePlanOptions plan_options{
      .prompt_cache_options_present = options->prompt_cache_options_present != 0,
      .explicit_mode = options->explicit_mode != 0,
      .automatic_system_candidate_enabled = options->automatic_system_candidate_disabled == 0,
      .total_tokens = options->total_tokens,
  };
  WritePlan plan;
  const kvpark::Status status = plan_write_candidates(input, plan_options, &plan);
  if (status != kvpark::Status::Ok) return to_c(status);
  for (uint32_t i = 0; i < plan.count; ++i) {
    const WriteCandidate& c = plan.candidates[i];
    ret_candidates[i] = kvpark_write_candidate{
        .position_tokens = c.position_tokens,
        .evidence = static_cast<kvpark_evidence>(c.evidence),
        .entry_class = static_cast<kvpark_entry_class>(c.entry_class),
        .reason = static_cast<kvpark_candidate_reason>(c.reason),
    };
  }
  *ret_count = plan.count;
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

kvpark_status kvpark_request_parse(const char* body, size_t body_bytes, kvpark_request_api api,
                                   kvpark_request** ret_request, char* ret_error,
                                   size_t error_bytes) try {
  if ((body == nullptr && body_bytes > 0) || ret_request == nullptr ||
      raw_value(api) < KVPARK_REQUEST_DETECT || raw_value(api) > KVPARK_REQUEST_RESPONSES) {
    return KVPARK_INVALID_ARGUMENT;
  }
  ParsedRequest parsed;
  RequestParseError error;
  RequestParseStatus status = RequestParseStatus::LimitExceeded;
  bool out_of_memory = false;
  try {  // the message is still worth giving when an allocation fails
    status = parse_openai_request(std::string_view(body == nullptr ? "" : body, body_bytes),
                                  static_cast<RequestApi>(api), &parsed, &error);
  } catch (const std::bad_alloc&) {
    error.message = "request: out of memory";
    out_of_memory = true;
  }
  if (status != RequestParseStatus::Ok) {
    if (ret_error != nullptr && error_bytes > 0) {
      const size_t n = std::min(error.message.size(), error_bytes - 1);
      std::memcpy(ret_error, error.message.data(), n);
      ret_error[n] = '\0';
    }
    if (out_of_memory) return KVPARK_OUT_OF_MEMORY;
    return status == RequestParseStatus::LimitExceeded ? KVPARK_LIMIT_EXCEEDED
                                                       : KVPARK_INVALID_ARGUMENT;
  }
  *ret_request = new kvpark_request{std::move(parsed)};
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void kvpark_request_free(kvpark_request* request) { delete request; }

size_t kvpark_request_message_count(const kvpark_request* request) {
  assert(request != nullptr);
  return request->parsed.messages.size();
}

kvpark_segment_kind kvpark_request_message_kind(const kvpark_request* request, size_t index) {
  assert(request != nullptr && index < request->parsed.messages.size());
  return static_cast<kvpark_segment_kind>(segment_kind_of(request->parsed.messages[index].role));
}

int kvpark_request_message_breakpoint(const kvpark_request* request, size_t index) {
  assert(request != nullptr && index < request->parsed.messages.size());
  return request->parsed.messages[index].breakpoint ? 1 : 0;
}

int kvpark_request_tools_present(const kvpark_request* request) {
  assert(request != nullptr);
  return request->parsed.tools_present ? 1 : 0;
}

int kvpark_request_prompt_cache_options_present(const kvpark_request* request) {
  assert(request != nullptr);
  return request->parsed.prompt_cache_options_present ? 1 : 0;
}

int kvpark_request_explicit_mode(const kvpark_request* request) {
  assert(request != nullptr);
  return request->parsed.explicit_mode ? 1 : 0;
}

kvpark_status kvpark_request_segments(const kvpark_request* request,
                                      const uint32_t* message_end_tokens, size_t n_messages,
                                      uint32_t tools_end_token,
                                      kvpark_tools_placement tools_placement,
                                      kvpark_segment* ret_segments, size_t segments_capacity,
                                      size_t* ret_count) try {
  if (request == nullptr || (message_end_tokens == nullptr && n_messages > 0) ||
      ret_segments == nullptr || ret_count == nullptr ||
      raw_value(tools_placement) < KVPARK_TOOLS_BEFORE_MESSAGES ||
      raw_value(tools_placement) > KVPARK_TOOLS_NOT_RENDERED) {
    return KVPARK_INVALID_ARGUMENT;
  }
  const RenderedOffsets offsets{
      .message_end_tokens = std::span<const uint32_t>(message_end_tokens, n_messages),
      .tools_end_token = tools_end_token,
      .tools_placement = static_cast<ToolsPlacement>(tools_placement),
  };
  std::vector<Segment> segments;
  const kvpark::Status status = segments_from_request(request->parsed, offsets, &segments);
  if (status != kvpark::Status::Ok) return to_c(status);
  if (segments.size() > segments_capacity) return KVPARK_INVALID_ARGUMENT;
  for (size_t i = 0; i < segments.size(); ++i) {
    ret_segments[i] = kvpark_segment{
        .kind = static_cast<kvpark_segment_kind>(segments[i].kind),
        .end_token = segments[i].end_token,
        .explicit_breakpoint = segments[i].explicit_breakpoint ? 1 : 0,
    };
  }
  *ret_count = segments.size();
  return KVPARK_OK;
} catch (...) {
  return status_of_current_exception();
}

void kvpark_request_write_plan_options(const kvpark_request* request, uint32_t total_tokens,
                                       int automatic_system_candidate_disabled,
                                       kvpark_write_plan_options* ret_options) {
  assert(request != nullptr && ret_options != nullptr);
  *ret_options = kvpark_write_plan_options{
      .prompt_cache_options_present = request->parsed.prompt_cache_options_present ? 1 : 0,
      .explicit_mode = request->parsed.explicit_mode ? 1 : 0,
      .automatic_system_candidate_disabled = automatic_system_candidate_disabled,
      .total_tokens = total_tokens,
  };
}

}  // extern "C"
