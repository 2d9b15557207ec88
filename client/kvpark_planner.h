/* libkvpark_planner: which prefixes of an OpenAI-style request to park.
 *
 * For engines that serve OpenAI Chat Completions or Responses requests. Parse the
 * body (kvpark_request_parse), render it with the engine's own chat template and
 * note where each message ends in tokens, turn both into segments
 * (kvpark_request_segments), then plan (kvpark_plan_write_candidates): at most
 * KVPARK_WRITE_CANDIDATES_MAX positions, each with the evidence and entry class to
 * publish it with (kvpark_publish_options in kvpark.h).
 *
 * The planner is a pure function: no I/O, no daemon, no state. The rules are in
 * docs/architecture.md ("Write-candidate planning"). Link: libkvpark_planner.a.
 * Threads: everything here may be called from any thread; a kvpark_request is
 * read-only after parsing.
 */
#ifndef KVPARK_PLANNER_H
#define KVPARK_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "kvpark.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVPARK_WRITE_CANDIDATES_MAX 4         /* writes one request may plan */
#define KVPARK_SYSTEM_FRONTIER_TOKENS_MIN 256 /* shortest head that earns a candidate */

typedef enum kvpark_segment_kind {
  KVPARK_SEGMENT_TOOLS = 0,       /* the tool definitions block */
  KVPARK_SEGMENT_SYSTEM = 1,      /* a system message, or Responses instructions */
  KVPARK_SEGMENT_DEVELOPER = 2,
  KVPARK_SEGMENT_USER = 3,
  KVPARK_SEGMENT_ASSISTANT = 4,   /* an assistant turn, its tool calls included */
  KVPARK_SEGMENT_TOOL_RESULT = 5, /* a tool / function call output message */
  KVPARK_SEGMENT_OTHER = 6
} kvpark_segment_kind;

typedef struct kvpark_segment {
  kvpark_segment_kind kind;
  uint32_t end_token;      /* tokens: where the segment ends in the rendered prompt */
  int explicit_breakpoint; /* nonzero: the client marked it */
} kvpark_segment;

/* Zero-initialised means: no prompt_cache_options, automatic mode, system candidate on. */
typedef struct kvpark_write_plan_options {
  int prompt_cache_options_present;
  int explicit_mode;                      /* only the client's marks are written */
  int automatic_system_candidate_disabled;
  uint32_t total_tokens;                  /* tokens in the rendered prompt */
} kvpark_write_plan_options;

typedef enum kvpark_candidate_reason {
  KVPARK_CANDIDATE_EXPLICIT = 0,        /* a client breakpoint */
  KVPARK_CANDIDATE_LAST_CONTENT = 1,    /* the end of the last segment */
  KVPARK_CANDIDATE_SYSTEM_FRONTIER = 2  /* the end of the leading tools/system/developer run */
} kvpark_candidate_reason;

typedef struct kvpark_write_candidate {
  uint32_t position_tokens; /* park the state after tokens [0, position_tokens) */
  kvpark_evidence evidence;
  kvpark_entry_class entry_class;
  kvpark_candidate_reason reason;
} kvpark_write_candidate;

/* Plans the writes for segments[0, n_segments) in render order. Writes *ret_count
 * (<= KVPARK_WRITE_CANDIDATES_MAX) candidates to ret_candidates, which must hold
 * KVPARK_WRITE_CANDIDATES_MAX, in increasing position. KVPARK_INVALID_ARGUMENT (and
 * nothing written) when end tokens decrease, exceed total_tokens, or a kind is
 * unknown. */
kvpark_status kvpark_plan_write_candidates(const kvpark_segment* segments, size_t n_segments,
                                           const kvpark_write_plan_options* options,
                                           kvpark_write_candidate* ret_candidates,
                                           size_t* ret_count);

typedef enum kvpark_request_api {
  KVPARK_REQUEST_DETECT = 0, /* "messages": Chat Completions; "input": Responses */
  KVPARK_REQUEST_CHAT_COMPLETIONS = 1,
  KVPARK_REQUEST_RESPONSES = 2
} kvpark_request_api;

typedef enum kvpark_tools_placement {
  KVPARK_TOOLS_BEFORE_MESSAGES = 0,       /* the template renders tools first */
  KVPARK_TOOLS_AFTER_LEADING_SYSTEM = 1,  /* right after the leading system/developer run */
  KVPARK_TOOLS_NOT_RENDERED = 2           /* no tools segment */
} kvpark_tools_placement;

typedef struct kvpark_request kvpark_request;

/* Parses a request body (body_bytes bytes, no terminator needed). On failure returns
 * KVPARK_INVALID_ARGUMENT (malformed JSON or shape), KVPARK_LIMIT_EXCEEDED or
 * KVPARK_OUT_OF_MEMORY, leaves *ret_request untouched and, when ret_error is not
 * NULL, writes a NUL-terminated message naming the JSON path ("messages[2].content:
 * expected a string or an array"), truncated to error_bytes. */
kvpark_status kvpark_request_parse(const char* body, size_t body_bytes, kvpark_request_api api,
                                   kvpark_request** ret_request, char* ret_error,
                                   size_t error_bytes);
void kvpark_request_free(kvpark_request* request); /* NULL is ignored */

/* Messages in render order (Responses: instructions first, then input items). */
size_t kvpark_request_message_count(const kvpark_request* request);
kvpark_segment_kind kvpark_request_message_kind(const kvpark_request* request, size_t index);
int kvpark_request_message_breakpoint(const kvpark_request* request, size_t index);
int kvpark_request_tools_present(const kvpark_request* request);
int kvpark_request_prompt_cache_options_present(const kvpark_request* request);
int kvpark_request_explicit_mode(const kvpark_request* request);

/* The segments of a parsed request rendered with these offsets: message_end_tokens
 * holds one end offset per message (kvpark_request_message_count); the tools block,
 * when present and rendered, ends at tools_end_token. Needs room for count + 1
 * segments. KVPARK_INVALID_ARGUMENT when the counts differ, the room is short, or
 * the offsets decrease in render order. */
kvpark_status kvpark_request_segments(const kvpark_request* request,
                                      const uint32_t* message_end_tokens, size_t n_messages,
                                      uint32_t tools_end_token,
                                      kvpark_tools_placement tools_placement,
                                      kvpark_segment* ret_segments, size_t segments_capacity,
                                      size_t* ret_count);

/* The planner options this request asks for. */
void kvpark_request_write_plan_options(const kvpark_request* request, uint32_t total_tokens,
                                       int automatic_system_candidate_disabled,
                                       kvpark_write_plan_options* ret_options);

#ifdef __cplusplus
}
#endif

#endif /* KVPARK_PLANNER_H */
