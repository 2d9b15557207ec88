// libkvpark's C boundary when allocations fail, against a real kvparkd: every call
// either succeeds or answers KVPARK_OUT_OF_MEMORY (std::bad_alloc never unwinds into
// the C caller, which would terminate this test), and the client stays usable.
//
// The fault seam is this binary's own operator new (allocation_seam.h): armed for the
// calling thread only, it fails the n-th allocation from now. Each test walks
// n = 0, 1, 2, ... until the call runs out of allocations to fail, so every allocation
// inside it fails once.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "client/kvpark.h"
#include "client/kvpark_planner.h"
#include "tests/fault/allocation_seam.h"
#include "tests/integration/in_process.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/wait.h"

namespace kvpark::testing {
namespace {

constexpr uint64_t ns_low = 0x00a110c;
constexpr uint32_t block_tokens = 16;
constexpr uint64_t block_bytes = 4096;
constexpr long allocations_max = 10'000;  // no call allocates this often

class OutOfMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    if (built_binary("KVPARKD").empty()) GTEST_SKIP() << "KVPARKD not set; run through meson test";
    daemon_ = std::make_unique<DaemonProcess>();
    ASSERT_TRUE(daemon_->start()) << "kvparkd did not start; log: " << daemon_->log_path();
    ns_ = engine_namespace(ns_low, block_tokens, block_bytes);
    client_ = connect_client(daemon_->socket_path(), ns_);
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    if (daemon_ != nullptr && daemon_->running()) {
      EXPECT_EQ(daemon_->stop(), 0);
    }
  }

  // Runs `call` with the n-th allocation failing, for every n until one runs clean;
  // each failed run must answer KVPARK_OUT_OF_MEMORY. Returns how many runs failed.
  template <typename Call>
  long fail_each_allocation(Call call) {
    long failures = 0;
    for (long n = 0; n < allocations_max; ++n) {
      arm_allocation_failure(n);
      const kvpark_status s = call();
      if (!disarm_allocation_failure()) {
        EXPECT_EQ(s, KVPARK_OK) << "with no allocation failed";
        return failures;
      }
      EXPECT_EQ(s, KVPARK_OUT_OF_MEMORY) << "allocation " << n << " failed: "
                                         << kvpark_status_string(s);
      ++failures;
    }
    ADD_FAILURE() << "the call never ran out of allocations to fail";
    return failures;
  }

  // Polls the daemon's stats until `done` holds; false if it did not within 10 s.
  template <typename Done>
  bool stats_reach(Done done) {
    return wait_until(
        [&] {
          kvpark_stats stats{};
          return kvpark_get_stats(client_.get(), &stats) == KVPARK_OK && done(stats);
        },
        10'000);
  }

  std::unique_ptr<DaemonProcess> daemon_;
  kvpark_namespace ns_{};
  ClientPtr client_;
};

TEST_F(OutOfMemory, ConnectAnswersOutOfMemoryAndLeavesNoConnection) {
  const long failures = fail_each_allocation([&] {
    kvpark_client* c = nullptr;
    const kvpark_status s = kvpark_connect(daemon_->socket_path().c_str(), &ns_, &c);
    if (s == KVPARK_OK) kvpark_disconnect(c);
    return s;
  });
  EXPECT_GT(failures, 0);
  // Every connection a failed connect opened is closed: the daemon sees only ours.
  EXPECT_TRUE(stats_reach([](const kvpark_stats& s) { return s.connections == 1; }));
}

TEST_F(OutOfMemory, ParkAndLookupAnswerOutOfMemoryAndTheClientStaysUsable) {
  const std::vector<int32_t> tokens = engine_prompt(11, 4 * block_tokens + 3);
  const std::vector<kvpark_hash128> hashes = block_hashes(ns_low, tokens, block_tokens);
  kvpark_publish_options options{.session_id = 1};
  EXPECT_GT(fail_each_allocation([&] {
              kvpark_reservation* r = nullptr;
              kvpark_status s =
                  kvpark_reserve_blocks(client_.get(), &options, tokens.data(), tokens.size(), 0,
                                        hashes.size(), &r);
              if (s == KVPARK_OK) s = kvpark_abort(r);
              return s;
            }),
            0);
  // Sealing allocates nothing (its frame was sized at reserve), so it cannot fail for
  // memory and leave the blocks reserved for good.
  kvpark_reservation* r = nullptr;
  ASSERT_EQ(kvpark_reserve_blocks(client_.get(), &options, tokens.data(), tokens.size(), 0,
                                  hashes.size(), &r),
            KVPARK_OK);
  for (size_t i = 0; i < hashes.size(); ++i) {
    void* p = kvpark_reservation_block(r, i);
    ASSERT_NE(p, nullptr) << "a failed reserve or abort left block " << i << " reserved";
    fill_payload(payload_key(hashes[i]), p, block_bytes);
  }
  arm_allocation_failure(0);
  EXPECT_EQ(kvpark_seal(r), KVPARK_OK);
  EXPECT_FALSE(disarm_allocation_failure()) << "kvpark_seal allocated";
  EXPECT_GT(fail_each_allocation([&] {
              kvpark_plan* plan = nullptr;
              const kvpark_status s =
                  kvpark_lookup(client_.get(), 1, tokens.data(), tokens.size(), &plan);
              kvpark_plan_release(plan);
              return s;
            }),
            0);
  // With allocations back, the client serves the blocks it parked, byte for byte.
  kvpark_plan* plan = nullptr;
  ASSERT_EQ(kvpark_lookup(client_.get(), 1, tokens.data(), tokens.size(), &plan), KVPARK_OK);
  EXPECT_EQ(kvpark_plan_restorable_tokens(plan), 4 * block_tokens);
  EXPECT_TRUE(plan_blocks_match(plan, ns_low, block_bytes, tokens, block_tokens));
  arm_allocation_failure(0);
  kvpark_plan_release(plan);
  EXPECT_FALSE(disarm_allocation_failure()) << "kvpark_plan_release allocated";
  // What failed calls were granted was ended: by abort, or with a dropped connection.
  EXPECT_TRUE(stats_reach([](const kvpark_stats& s) {
    return s.reservations == 0 && s.leases == 0 && s.connections == 1;
  }));
  EXPECT_GT(fail_each_allocation([&] {
              kvpark_stats stats{};
              return kvpark_get_stats(client_.get(), &stats);
            }),
            0);
}

TEST_F(OutOfMemory, SnapshotReserveAnswersOutOfMemory) {
  kvpark_namespace snapshot_ns = engine_namespace(ns_low + 1, 0, 0);
  ClientPtr c = connect_client(daemon_->socket_path(), snapshot_ns);
  ASSERT_NE(c, nullptr);
  const std::vector<int32_t> tokens = engine_prompt(12, 100);
  EXPECT_GT(fail_each_allocation([&] {
              kvpark_publish_options options{.session_id = 1};
              kvpark_reservation* r = nullptr;
              kvpark_status s = kvpark_reserve_snapshot(c.get(), &options, tokens.data(),
                                                        tokens.size(), 8192, &r);
              if (s == KVPARK_OK) s = kvpark_abort(r);
              return s;
            }),
            0);
}

TEST_F(OutOfMemory, PlannerAnswersOutOfMemory) {
  const char body[] =
      R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]})";
  EXPECT_GT(fail_each_allocation([&] {
              kvpark_request* request = nullptr;
              char error[128] = {};
              const kvpark_status s = kvpark_request_parse(body, sizeof body - 1,
                                                           KVPARK_REQUEST_DETECT, &request, error,
                                                           sizeof error);
              kvpark_request_free(request);
              return s;
            }),
            0);
}

}  // namespace
}  // namespace kvpark::testing
