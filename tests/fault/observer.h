// A well-behaved libkvpark engine that fault tests keep beside the misbehaving
// peers: it publishes and verifies a prompt byte for byte, reads daemon stats,
// and checks that nothing leaked once the misbehaving peers are gone.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "client/kvpark.h"
#include "tests/testing/content.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {

inline constexpr kvpark_hash128 observer_ns_id{0x0b5e7e7, 0xfa017};
inline constexpr uint32_t observer_block_tokens = 16;
inline constexpr uint64_t observer_block_bytes = 4096;
inline constexpr size_t observer_blocks = 4;

class Observer {
 public:
  ~Observer() { kvpark_disconnect(client_); }

  kvpark_status connect(const std::string& socket_path) {
    kvpark_namespace ns{.id = observer_ns_id,
                        .block_tokens = observer_block_tokens,
                        .block_payload_bytes = observer_block_bytes,
                        .snapshot_required = 0,
                        .prefill_tokens_per_second = 0,
                        .client_name = "observer"};
    tokens_ = make_tokens(77, observer_blocks * observer_block_tokens + 3);
    hashes_.resize(observer_blocks);
    kvpark_chain_hashes(observer_ns_id, tokens_.data(), observer_block_tokens, observer_blocks,
                        hashes_.data());
    return kvpark_connect(socket_path.c_str(), &ns, &client_);
  }
  kvpark_client* client() const { return client_; }

  kvpark_stats stats() {
    kvpark_stats s{};
    EXPECT_EQ(kvpark_get_stats(client_, &s), KVPARK_OK);
    return s;
  }

  // Publishes the observer's prompt (a no-op once parked), then restores it and
  // checks every byte. The same prompt every time: arena use stays constant.
  void publish_and_verify() {
    kvpark_publish_options options{.session_id = 1, .entry_class = KVPARK_CLASS_SHARED,
                                   .evidence = KVPARK_EVIDENCE_EXPLICIT_BREAKPOINT};
    kvpark_reservation* r = nullptr;
    ASSERT_EQ(kvpark_reserve_blocks(client_, &options, tokens_.data(), tokens_.size(), 0,
                                    observer_blocks, &r),
              KVPARK_OK);
    for (size_t i = 0; i < observer_blocks; ++i) {
      if (void* p = kvpark_reservation_block(r, i)) {
        fill_payload(payload_key(hashes_[i]), p, observer_block_bytes);
      }
    }
    ASSERT_EQ(kvpark_seal(r), KVPARK_OK);
    kvpark_plan* plan = nullptr;
    ASSERT_EQ(kvpark_lookup(client_, 1, tokens_.data(), tokens_.size(), &plan), KVPARK_OK);
    EXPECT_EQ(kvpark_plan_restorable_tokens(plan), observer_blocks * observer_block_tokens);
    ASSERT_EQ(kvpark_plan_block_count(plan), observer_blocks);
    for (size_t i = 0; i < observer_blocks; ++i) {
      EXPECT_TRUE(payload_matches(payload_key(hashes_[i]), kvpark_plan_block(plan, i),
                                  observer_block_bytes))
          << "block " << i;
    }
    kvpark_plan_release(plan);
  }

  // Waits until the daemon has closed every connection but `connections`, then
  // checks that leases, reservations and arena bytes are back to `baseline`.
  void expect_back_to(const kvpark_stats& baseline, int timeout_msec = wait_timeout_msec_default) {
    kvpark_stats now{};
    wait_until(
        [&] {
          now = stats();
          return now.connections == baseline.connections && now.leases == baseline.leases &&
                 now.reservations == baseline.reservations;
        },
        timeout_msec);
    EXPECT_EQ(now.connections, baseline.connections);
    EXPECT_EQ(now.leases, baseline.leases);
    EXPECT_EQ(now.reservations, baseline.reservations);
    EXPECT_EQ(now.arena_free_bytes, baseline.arena_free_bytes);
    EXPECT_EQ(now.blocks, baseline.blocks);
  }

 private:
  kvpark_client* client_ = nullptr;
  std::vector<int32_t> tokens_;
  std::vector<kvpark_hash128> hashes_;
};

}  // namespace kvpark::testing
