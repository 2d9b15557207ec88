// The value model and the tiering policy's decisions: pure functions of an entry,
// its namespace and the time.
#include "daemon/value_model.h"

#include <gtest/gtest.h>

#include "daemon/tiering_policy.h"

namespace kvpark::daemon {
namespace {

constexpr uint64_t now = 100ull * 3600 * 1'000'000;  // any instant later than the ages used

NamespaceInfo block_namespace() {
  NamespaceInfo ns;
  ns.geometry = {.block_tokens = 64, .block_payload_bytes = 4096};
  ns.chain_tokens = 64;
  ns.prefill_tokens_per_second = 6400;
  return ns;
}

Entry block(EntryClass entry_class = EntryClass::Private,
            Evidence evidence = Evidence::DefaultAutomatic, uint64_t age_usec = 0) {
  Entry e;
  e.kind = EntryKind::Block;
  e.extent_bytes = 8192;
  e.entry_class = entry_class;
  e.evidence = evidence;
  e.last_use_usec = now - age_usec;
  return e;
}

TEST(ValueModel, ABlockSavesItsOwnTokensAtTheNamespaceRate) {
  EXPECT_DOUBLE_EQ(saved_prefill_seconds(block(), block_namespace()), 0.01);
}

TEST(ValueModel, ASnapshotSavesEverythingUpToItsPosition) {
  Entry e = block();
  e.kind = EntryKind::Snapshot;
  e.position = 640;
  EXPECT_DOUBLE_EQ(saved_prefill_seconds(e, block_namespace()), 0.1);
}

TEST(ValueModel, AnUndeclaredRateIsTheDefault) {
  NamespaceInfo ns = block_namespace();
  ns.prefill_tokens_per_second = 0;
  EXPECT_DOUBLE_EQ(saved_prefill_seconds(block(), ns), 64.0 / prefill_tokens_per_second_default);
}

TEST(ValueModel, SharedIsWorthTwicePrivate) {
  const NamespaceInfo ns = block_namespace();
  EXPECT_DOUBLE_EQ(value_density(block(EntryClass::Shared), ns, now),
                   2 * value_density(block(EntryClass::Private), ns, now));
}

TEST(ValueModel, ExplicitBreakpointsWeighFourTimesTheDefault) {
  const NamespaceInfo ns = block_namespace();
  EXPECT_DOUBLE_EQ(value_density(block(EntryClass::Private, Evidence::ExplicitBreakpoint), ns, now),
                   4 * value_density(block(), ns, now));
}

TEST(ValueModel, ReuseLikelihoodHalvesEveryHalfLife) {
  const NamespaceInfo ns = block_namespace();
  EXPECT_DOUBLE_EQ(value_density(block(EntryClass::Private, Evidence::DefaultAutomatic,
                                       private_half_life_usec),
                                 ns, now),
                   value_density(block(), ns, now) / 2);
  EXPECT_DOUBLE_EQ(value_density(block(EntryClass::Shared, Evidence::DefaultAutomatic,
                                       shared_half_life_usec),
                                 ns, now),
                   value_density(block(EntryClass::Shared), ns, now) / 2);
}

TEST(ValueModel, HitsRaiseTheLikelihood) {
  const NamespaceInfo ns = block_namespace();
  Entry e = block();
  e.hits = 3;
  EXPECT_DOUBLE_EQ(value_density(e, ns, now), 4 * value_density(block(), ns, now));
}

TEST(ValueModel, AHostCopyBackedByDiskIsWorthATenth) {
  const NamespaceInfo ns = block_namespace();
  Entry e = block();
  e.on_disk = true;
  EXPECT_DOUBLE_EQ(value_density(e, ns, now), disk_copy_value_share * value_density(block(), ns, now));
}

TEST(ValueModel, APrivateOneOffIsWorthKeepingUntilItsKeepTime) {
  EXPECT_TRUE(worth_keeping(block(EntryClass::Private, Evidence::DefaultAutomatic,
                                  private_keep_usec - 1),
                            now));
  EXPECT_FALSE(worth_keeping(block(EntryClass::Private, Evidence::DefaultAutomatic,
                                   private_keep_usec),
                             now));
}

TEST(ValueModel, SharedReusedOrMarkedEntriesAreAlwaysWorthKeeping) {
  const uint64_t old = private_keep_usec * 10;
  EXPECT_TRUE(worth_keeping(block(EntryClass::Shared, Evidence::DefaultAutomatic, old), now));
  EXPECT_TRUE(worth_keeping(block(EntryClass::Private, Evidence::EngineStructural, old), now));
  Entry reused = block(EntryClass::Private, Evidence::DefaultAutomatic, old);
  reused.hits = 1;
  EXPECT_TRUE(worth_keeping(reused, now));
}

TEST(TieringPolicy, SharedAndExplicitEntriesAreWrittenThrough) {
  EXPECT_TRUE(TieringPolicy::write_through(block(EntryClass::Shared)));
  EXPECT_TRUE(TieringPolicy::write_through(block(EntryClass::Private, Evidence::ExplicitBreakpoint)));
  EXPECT_FALSE(TieringPolicy::write_through(block(EntryClass::Private, Evidence::EngineStructural)));
}

TEST(TieringPolicy, DemotesOnlyWhatIsWorthKeepingToAWritableDisk) {
  const Entry keep = block(EntryClass::Shared);
  EXPECT_TRUE(TieringPolicy::demotes(keep, true, now));
  EXPECT_FALSE(TieringPolicy::demotes(keep, false, now));
  Entry on_disk = keep;
  on_disk.on_disk = true;
  EXPECT_FALSE(TieringPolicy::demotes(on_disk, true, now));
  EXPECT_FALSE(TieringPolicy::demotes(
      block(EntryClass::Private, Evidence::DefaultAutomatic, private_keep_usec), true, now));
}

TEST(TieringPolicy, AnOperatorFlushTakesEverythingTheShutdownFlushWhatIsWorthKeeping) {
  const Entry one_off = block(EntryClass::Private, Evidence::DefaultAutomatic, private_keep_usec);
  EXPECT_TRUE(TieringPolicy::flush_takes(one_off, true, now));
  EXPECT_FALSE(TieringPolicy::flush_takes(one_off, false, now));
}

TEST(TieringPolicy, LoadsFromDiskUntilTheBandwidthIsMeasured) {
  TieringPolicy policy;
  Entry huge = block();
  huge.extent_bytes = 1ull << 40;
  EXPECT_TRUE(policy.load_beats_recompute(huge, block_namespace()));
}

TEST(TieringPolicy, ABusyPeriodBelowTheSampleSizeMeasuresNothing) {
  TieringPolicy policy;
  policy.promotion_started();
  policy.promotion_completed(bandwidth_sample_bytes_min - 1);
  EXPECT_EQ(policy.disk_read_bytes_per_second(), 0);
  policy.promotion_started();
  policy.promotion_completed(bandwidth_sample_bytes_min);
  EXPECT_GT(policy.disk_read_bytes_per_second(), 0);
}

TEST(TieringPolicy, AMeasuredDiskRecomputesWhatIsFasterToPrefill) {
  TieringPolicy policy;
  policy.promotion_started();
  policy.promotion_completed(bandwidth_sample_bytes_min);
  Entry huge = block();
  huge.extent_bytes = 1ull << 50;  // longer to read than 64 tokens take at any measured rate
  EXPECT_FALSE(policy.load_beats_recompute(huge, block_namespace()));
}

}  // namespace
}  // namespace kvpark::daemon
