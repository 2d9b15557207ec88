// Rendering, tokenizing and write-candidate planning (see prompt.h).
#include "bench/replay/prompt.h"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include "client/openai_request.h"
#include "client/write_candidates.h"

namespace kvpark::replay {
namespace {

constexpr uint32_t vocabulary_size = 50'000;

bool word_byte(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         c >= 0x80;
}

bool space_byte(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int32_t token_id(std::string_view piece) {
  uint32_t h = 2166136261u;
  for (unsigned char c : piece) {
    h ^= c;
    h *= 16777619u;
  }
  return static_cast<int32_t>(h % vocabulary_size + 1);
}

const char* role_name(client::MessageRole role) {
  switch (role) {
    case client::MessageRole::System: return "system";
    case client::MessageRole::Developer: return "developer";
    case client::MessageRole::User: return "user";
    case client::MessageRole::Assistant: return "assistant";
    case client::MessageRole::Tool: return "tool";
    case client::MessageRole::Other: return "other";
  }
  return "other";
}

const char* rule_name(client::CandidateReason reason) {
  switch (reason) {
    case client::CandidateReason::Explicit: return "explicit";
    case client::CandidateReason::LastContent: return "last-content";
    case client::CandidateReason::SystemFrontier: return "system-frontier";
  }
  return "?";
}

}  // namespace

void tokenize(std::string_view text, std::vector<int32_t>& ret_tokens) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (space_byte(c)) {
      ++i;
    } else if (word_byte(c)) {
      size_t j = i;
      while (j < text.size() && word_byte(static_cast<unsigned char>(text[j]))) ++j;
      ret_tokens.push_back(token_id(text.substr(i, j - i)));
      i = j;
    } else {
      ret_tokens.push_back(token_id(text.substr(i, 1)));
      ++i;
    }
  }
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

bool render_request(std::string_view body_json, bool automatic_system_candidate,
                    RenderedPrompt& ret_prompt, std::string& ret_error) {
  client::ParsedRequest request;
  client::RequestParseError error;
  if (client::parse_openai_request(body_json, client::RequestApi::Detect, &request, &error) !=
      client::RequestParseStatus::Ok) {
    ret_error = error.message;
    return false;
  }
  RenderedPrompt out;
  uint32_t tools_end = 0;
  if (request.tools_present) {
    // The parser keeps no tool text; the template renders the array as compact JSON.
    rapidjson::Document doc;
    doc.Parse(body_json.data(), body_json.size());
    const char* key = doc.HasMember("tools") ? "tools" : "functions";
    rapidjson::StringBuffer buffer;
    rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
    doc[key].Accept(writer);
    tokenize("<|tools|>\n", out.tokens);
    tokenize(std::string_view(buffer.GetString(), buffer.GetSize()), out.tokens);
    tools_end = static_cast<uint32_t>(out.tokens.size());
  }
  std::vector<uint32_t> message_ends;
  for (const client::RequestMessage& m : request.messages) {
    tokenize(std::string("<|") + role_name(m.role) + "|>\n", out.tokens);
    for (const client::ContentPart& part : m.parts) tokenize(part.text, out.tokens);
    message_ends.push_back(static_cast<uint32_t>(out.tokens.size()));
  }
  std::vector<client::Segment> segments;
  const client::RenderedOffsets offsets{.message_end_tokens = message_ends,
                                        .tools_end_token = tools_end,
                                        .tools_placement = client::ToolsPlacement::BeforeMessages};
  if (client::segments_from_request(request, offsets, &segments) != Status::Ok) {
    ret_error = "segments_from_request refused the rendered offsets";
    return false;
  }
  const auto total = static_cast<uint32_t>(out.tokens.size());
  client::WritePlan plan;
  if (client::plan_write_candidates(
          segments, client::write_plan_options(request, total, automatic_system_candidate),
          &plan) != Status::Ok) {
    ret_error = "plan_write_candidates refused the segments";
    return false;
  }
  out.head_end = plan.head_end_tokens;
  for (const client::WriteCandidate& c : plan.view()) {
    out.candidates.push_back({.position = c.position_tokens,
                              .entry_class = static_cast<kvpark_entry_class>(c.entry_class),
                              .evidence = static_cast<kvpark_evidence>(c.evidence),
                              .rule = rule_name(c.reason)});
  }
  ret_prompt = std::move(out);
  return true;
}

}  // namespace kvpark::replay
