// In-process libkvpark helpers for integration tests: the same prompts and payloads
// kvpark-test-engine uses (tests/testing/content.h), so bytes parked by one side can
// be checked by the other.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/kvpark.h"
#include "tests/testing/content.h"

namespace kvpark::testing {

struct ClientDeleter {
  void operator()(kvpark_client* c) const { kvpark_disconnect(c); }
};
using ClientPtr = std::unique_ptr<kvpark_client, ClientDeleter>;

struct PlanDeleter {
  void operator()(kvpark_plan* p) const { kvpark_plan_release(p); }
};
using PlanPtr = std::unique_ptr<kvpark_plan, PlanDeleter>;

// The namespace kvpark-test-engine declares for --ns ns_low --block-tokens --block-bytes.
inline kvpark_namespace engine_namespace(uint64_t ns_low, uint32_t block_tokens,
                                         uint64_t block_bytes) {
  kvpark_namespace ns{};
  ns.id = {ns_low, 0};
  ns.block_tokens = block_tokens;
  ns.block_payload_bytes = block_tokens > 0 ? block_bytes : 0;
  ns.snapshot_required = block_tokens == 0;
  ns.client_name = "integration-test";
  return ns;
}

inline ClientPtr connect_client(const std::string& socket, const kvpark_namespace& ns,
                                kvpark_status* ret_status = nullptr) {
  kvpark_client* c = nullptr;
  const kvpark_status s = kvpark_connect(socket.c_str(), &ns, &c);
  if (ret_status != nullptr) *ret_status = s;
  return ClientPtr(s == KVPARK_OK ? c : nullptr);
}

// The engine's prompt: head tokens then body tokens.
inline std::vector<int32_t> engine_prompt(uint64_t head_seed, size_t head_tokens,
                                          uint64_t body_seed = 2, size_t body_tokens = 0) {
  std::vector<int32_t> tokens = make_tokens(head_seed, head_tokens);
  std::vector<int32_t> body = make_tokens(body_seed, body_tokens);
  tokens.insert(tokens.end(), body.begin(), body.end());
  return tokens;
}

inline std::vector<kvpark_hash128> block_hashes(uint64_t ns_low, const std::vector<int32_t>& tokens,
                                                uint32_t chain_tokens) {
  std::vector<kvpark_hash128> h(tokens.size() / chain_tokens);
  kvpark_chain_hashes({ns_low, 0}, tokens.data(), chain_tokens, h.size(), h.data());
  return h;
}

// Parks every whole block of `tokens` with the engine's payloads; the seal status,
// or the reserve status when reserving failed. ret_written: blocks this call wrote.
inline kvpark_status park_blocks(kvpark_client* c, uint64_t ns_low, uint64_t block_bytes,
                                 const std::vector<int32_t>& tokens, uint64_t session,
                                 size_t* ret_written = nullptr) {
  const uint32_t chain = kvpark_chain_tokens(c);
  const size_t blocks = tokens.size() / chain;
  const auto hashes = block_hashes(ns_low, tokens, chain);
  kvpark_publish_options options{session, KVPARK_CLASS_PRIVATE, KVPARK_EVIDENCE_DEFAULT_AUTOMATIC};
  kvpark_reservation* r = nullptr;
  kvpark_status s = kvpark_reserve_blocks(c, &options, tokens.data(), tokens.size(), 0, blocks, &r);
  if (s != KVPARK_OK) return s;
  size_t written = 0;
  for (size_t i = 0; i < blocks; ++i) {
    void* p = kvpark_reservation_block(r, i);
    if (p == nullptr) continue;
    fill_payload(payload_key(hashes[i]), p, block_bytes);
    ++written;
  }
  if (ret_written != nullptr) *ret_written = written;
  return kvpark_seal(r);
}

// True when every block the plan restores holds the engine's payload for `tokens`.
inline bool plan_blocks_match(const kvpark_plan* plan, uint64_t ns_low, uint64_t block_bytes,
                              const std::vector<int32_t>& tokens, uint32_t chain_tokens) {
  const auto hashes = block_hashes(ns_low, tokens, chain_tokens);
  if (kvpark_plan_block_count(plan) > hashes.size()) return false;
  for (size_t i = 0; i < kvpark_plan_block_count(plan); ++i) {
    const void* block = kvpark_plan_block(plan, i);  // verified against its checksum
    if (block == nullptr || !payload_matches(payload_key(hashes[i]), block, block_bytes)) {
      return false;
    }
  }
  return true;
}

}  // namespace kvpark::testing
