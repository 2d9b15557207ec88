#include "proxy/prompt_prefixes.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <xxhash.h>

#include <cstring>

#include "proto/limits.h"

namespace kvpark::proxy {
namespace {

constexpr uint64_t prefix_key_format = 1;  // bump when what a key covers changes

std::string json_of(const rapidjson::Value& v) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> w(buffer);
  v.Accept(w);
  return std::string(buffer.GetString(), buffer.GetSize());
}

// A chained hash: h' = XXH3-64(piece, seed h), pieces length-prefixed by the seed chain.
uint64_t chain(uint64_t h, const std::string& piece) {
  return XXH3_64bits_withSeed(piece.data(), piece.size(), h ^ (piece.size() * 0x9E3779B97F4A7C15ull));
}

}  // namespace

PrefixKeys::PrefixKeys(const rapidjson::Document& request) : request_(request) {
  uint64_t h = prefix_key_format;
  const rapidjson::Value* messages = nullptr;
  if (request.IsObject()) {
    for (auto m = request.MemberBegin(); m != request.MemberEnd(); ++m) {
      const std::string name(m->name.GetString(), m->name.GetStringLength());
      if (name == "messages") {
        messages = &m->value;
        continue;
      }
      if (name == "stream" || name == "stream_options") continue;  // not rendered
      h = chain(chain(h, name), json_of(m->value));
    }
  }
  states_.push_back(h);
  if (messages != nullptr && messages->IsArray()) {
    message_count_ = messages->Size();
    for (const auto& m : messages->GetArray()) {
      h = chain(h, json_of(m));
      states_.push_back(h);
    }
  }
}

uint64_t PrefixKeys::key(size_t keep, const char* role) const {
  return chain(states_.at(keep), std::string("\x01role:") + role);
}

const char* PrefixKeys::role(size_t index) const {
  const auto& m = request_["messages"][rapidjson::SizeType(index)];
  return m.IsObject() && m.HasMember("role") && m["role"].IsString() ? m["role"].GetString() : "";
}

void PromptPrefixes::remember(uint64_t key, Tokens tokens) {
  if (tokens.empty() || tokens.size() > limits::proxy_prefix_cache_tokens_max) return;
  std::lock_guard lock(mutex_);
  auto it = known_.find(key);
  if (it != known_.end()) {
    if (*it->second == tokens) return;
    tokens_ -= it->second->size();  // rendered otherwise now: the newer wins
    it->second = std::make_shared<const Tokens>(std::move(tokens));
    tokens_ += it->second->size();
    return;
  }
  while (tokens_ + tokens.size() > limits::proxy_prefix_cache_tokens_max && !order_.empty()) {
    auto oldest = known_.find(order_.front());
    order_.pop_front();
    if (oldest == known_.end()) continue;
    tokens_ -= oldest->second->size();
    known_.erase(oldest);
  }
  tokens_ += tokens.size();
  known_.emplace(key, std::make_shared<const Tokens>(std::move(tokens)));
  order_.push_back(key);
}

std::shared_ptr<const Tokens> PromptPrefixes::find(uint64_t key) const {
  std::lock_guard lock(mutex_);
  auto it = known_.find(key);
  return it == known_.end() ? nullptr : it->second;
}

std::shared_ptr<const Tokens> PromptPrefixes::longest(const PrefixKeys& keys, size_t keep_min,
                                                      size_t* ret_keep) const {
  for (size_t keep = keys.messages(); keep-- > keep_min;) {
    const char* role = keys.role(keep);
    if (*role == '\0') continue;
    if (auto tokens = find(keys.key(keep, role))) {
      *ret_keep = keep;
      return tokens;
    }
  }
  return nullptr;
}

void PromptPrefixes::clear() {
  std::lock_guard lock(mutex_);
  known_.clear();
  order_.clear();
  tokens_ = 0;
}

size_t PromptPrefixes::tokens() const {
  std::lock_guard lock(mutex_);
  return tokens_;
}

}  // namespace kvpark::proxy
