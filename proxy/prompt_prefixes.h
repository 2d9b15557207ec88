// Token ids of conversation prefixes, as the upstream rendered and tokenized them,
// so that a request continuing one can be routed and forwarded without a render or
// tokenize round trip first (docs/proxy.md, "Forwarding without a round trip").
//
// A prefix is messages[0, keep) followed by the opening of a message of `role` up to
// where its content starts: the tokens two renderings with stand-in contents share
// (chat.cpp). Its key hashes everything the template sees except the messages after
// it: the other members of the request (tools, template options, ...) and those
// messages, each serialized. What a cached prefix gives is a prefix of the request's
// own tokenization unless the tokenizer merges across the boundary for this
// request's content; the proxy checks that against the full tokenization after the
// response and never parks or believes a slot holds anything but the full one.
#pragma once

#include <rapidjson/document.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace kvpark::proxy {

using Tokens = std::vector<int32_t>;

// Keys of a request's message prefixes.
class PrefixKeys {
 public:
  explicit PrefixKeys(const rapidjson::Document& request);
  size_t messages() const { return message_count_; }
  // messages[0, keep) followed by a `role` message's opening; keep <= messages().
  uint64_t key(size_t keep, const char* role) const;
  // The role of messages[index] ("" when it has none).
  const char* role(size_t index) const;

 private:
  const rapidjson::Document& request_;
  size_t message_count_ = 0;
  std::vector<uint64_t> states_;  // XXH3-64 of the request so far, after 0..n messages
};

class PromptPrefixes {
 public:
  void remember(uint64_t key, Tokens tokens);
  std::shared_ptr<const Tokens> find(uint64_t key) const;
  // The longest known prefix messages[0, keep) + messages[keep]'s opening with keep
  // in [keep_min, messages); nullptr when none. *ret_keep: its keep.
  std::shared_ptr<const Tokens> longest(const PrefixKeys& keys, size_t keep_min,
                                        size_t* ret_keep) const;
  void clear();
  size_t tokens() const;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<const Tokens>> known_;
  std::deque<uint64_t> order_;  // oldest first
  size_t tokens_ = 0;
};

}  // namespace kvpark::proxy
