// The replayer's stand-in for an engine's chat template and tokenizer, and the
// write candidates the planner picks for a rendered request.
//
// Template: the tools block first when present ("<|tools|>\n" + the tools array
// as compact JSON + "\n"), then each message as "<|role|>\n" + its text + "\n".
// Tokenizer: pieces are maximal runs of letters/digits (bytes >= 0x80 count as
// letters) and single punctuation characters; whitespace separates and is dropped;
// id = FNV-1a-32(piece) mod 50,000 + 1. It is deterministic across processes and
// prefix-stable per segment (no piece crosses a segment end, which is a newline),
// so a conversation's next turn extends its previous prompt token for token.
// It stands in for a model tokenizer; nothing here depends on its vocabulary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "client/kvpark.h"

namespace kvpark::replay {

// Appends the token ids of `text` to ret_tokens.
void tokenize(std::string_view text, std::vector<int32_t>& ret_tokens);

struct Candidate {
  uint32_t position = 0;  // tokens
  kvpark_entry_class entry_class = KVPARK_CLASS_PRIVATE;
  kvpark_evidence evidence = KVPARK_EVIDENCE_DEFAULT_AUTOMATIC;
  const char* rule = "";  // "explicit", "last-content", "system-frontier", "capture-hint"
};

struct RenderedPrompt {
  std::vector<int32_t> tokens;
  uint32_t head_end = 0;              // tokens: end of the leading tools/system/developer run
  std::vector<Candidate> candidates;  // by position
};

// Parses, renders, tokenizes and plans one OpenAI request body. False with
// ret_error on a body the planner's parser refuses.
bool render_request(std::string_view body_json, bool automatic_system_candidate,
                    RenderedPrompt& ret_prompt, std::string& ret_error);

// FNV-1a-64 of a string (session ids from conversation ids).
uint64_t fnv1a64(std::string_view text);

}  // namespace kvpark::replay
