// LatencyHistogram with the disk tier's bounds: Prometheus' cumulative buckets, edges exact.
// With the remote tier's bounds: microsecond buckets, percentiles read from them at the edges
// (a bucket's bound, empty, the overflow bucket).
#include <gtest/gtest.h>

#include "daemon/control.h"

namespace kvpark::daemon {
namespace {

TEST(DiskLatencyHistogram, BucketsAreCumulativeAndInclusiveAtTheirBound) {
  DiskLatencyHistogram h;
  h.observe(500);         // exactly the first bound (0.5 ms): counted in it
  h.observe(3'000);       // between 2.5 and 5 ms
  h.observe(20'000'000);  // past every bound (20 s): only in the overflow bucket
  EXPECT_EQ(h.count, 3u);
  EXPECT_EQ(h.sum_usec, 20'003'500u);
  EXPECT_EQ(h.cumulative(0), 1u);                                 // <= 0.5 ms
  EXPECT_EQ(h.cumulative(2), 1u);                                 // <= 2.5 ms
  EXPECT_EQ(h.cumulative(3), 2u);                                 // <= 5 ms
  EXPECT_EQ(h.cumulative(DiskLatencyHistogram::bounded_buckets - 1), 2u);  // <= 10 s
  EXPECT_EQ(h.cumulative(DiskLatencyHistogram::bounded_buckets), 3u);      // +Inf
  for (size_t i = 1; i < DiskLatencyHistogram::bucket_count; ++i) {
    EXPECT_LE(h.cumulative(i - 1), h.cumulative(i)) << "not cumulative at " << i;
  }
}

TEST(DiskLatencyHistogram, KeepsTheDiskTiersBoundsFromHalfAMillisecondToTenSeconds) {
  EXPECT_EQ(DiskLatencyHistogram::bounds_usec[0], 500u);
  EXPECT_EQ(DiskLatencyHistogram::bounds_usec[DiskLatencyHistogram::bounded_buckets - 1],
            10'000'000u);
  EXPECT_EQ(DiskLatencyHistogram::bounded_buckets, 14u);
}

constexpr size_t remote_bounded = RemoteLatencyHistogram::bounded_buckets;
constexpr uint64_t remote_last_bound_usec = remote_latency_bounds_usec[remote_bounded - 1];

TEST(RemoteLatencyHistogram, AnObservationAtABoundIsInThatBucketAndOnePastItInTheNext) {
  RemoteLatencyHistogram h;
  h.observe(remote_latency_bounds_usec[0]);      // 50: the first bucket
  h.observe(remote_latency_bounds_usec[0] + 1);  // 51: the second
  h.observe(0);                                  // the first
  h.observe(remote_latency_bounds_usec[3]);      // 500: the fourth, (250, 500]
  EXPECT_EQ(h.buckets[0], 2u);
  EXPECT_EQ(h.buckets[1], 1u);
  EXPECT_EQ(h.buckets[2], 0u);
  EXPECT_EQ(h.buckets[3], 1u);
  EXPECT_EQ(h.cumulative(0), 2u);
  EXPECT_EQ(h.cumulative(1), 3u);
  EXPECT_EQ(h.cumulative(3), 4u);
  EXPECT_EQ(h.cumulative(remote_bounded), 4u);
  EXPECT_EQ(h.count, 4u);
  EXPECT_EQ(h.sum_usec, 50u + 51u + 500u);
  EXPECT_EQ(h.max_usec, 500u);
}

TEST(RemoteLatencyHistogram, PastTheLastBoundIsTheOverflowBucketAndReadsAsTheLargest) {
  RemoteLatencyHistogram h;
  h.observe(remote_last_bound_usec);  // the last bounded bucket
  EXPECT_EQ(h.buckets[remote_bounded - 1], 1u);
  EXPECT_EQ(h.buckets[remote_bounded], 0u);
  h.observe(remote_last_bound_usec + 1);
  h.observe(3 * remote_last_bound_usec);
  EXPECT_EQ(h.buckets[remote_bounded], 2u);
  EXPECT_EQ(h.cumulative(remote_bounded - 1), 1u);  // le = the last bound
  EXPECT_EQ(h.cumulative(remote_bounded), 3u);      // +Inf
  EXPECT_EQ(h.percentile_usec(100), 3 * remote_last_bound_usec);
  EXPECT_EQ(h.percentile_usec(50), 3 * remote_last_bound_usec);  // rank 2: overflow
  EXPECT_EQ(h.percentile_usec(33), remote_last_bound_usec);      // rank 1
}

TEST(RemoteLatencyHistogram, EmptyReadsZeroEverywhere) {
  const RemoteLatencyHistogram h;
  EXPECT_EQ(h.count, 0u);
  EXPECT_EQ(h.mean_usec(), 0u);
  EXPECT_EQ(h.percentile_usec(1), 0u);
  EXPECT_EQ(h.percentile_usec(50), 0u);
  EXPECT_EQ(h.percentile_usec(100), 0u);
  EXPECT_EQ(h.cumulative(RemoteLatencyHistogram::bounded_buckets), 0u);
}

TEST(RemoteLatencyHistogram, APercentileIsTheBoundOfTheBucketHoldingItsRank) {
  RemoteLatencyHistogram h;
  for (int i = 0; i < 98; ++i) h.observe(80);  // (50, 100]
  h.observe(2'000);                            // (1000, 2500]
  h.observe(2'000);
  EXPECT_EQ(h.percentile_usec(50), 100u);
  EXPECT_EQ(h.percentile_usec(98), 100u);   // rank 98: the last of the small ones
  EXPECT_EQ(h.percentile_usec(99), 2'000u);  // rank 99: its bucket's bound 2500 > the largest
  EXPECT_EQ(h.mean_usec(), (98u * 80u + 4'000u) / 100u);
  h.observe(2'400);                          // same bucket, the largest now
  EXPECT_EQ(h.percentile_usec(100), 2'400u);
  h.observe(3'000);                          // (2500, 5000]: the 2500 bound is now below the largest
  EXPECT_EQ(h.percentile_usec(99), 2'500u);  // rank ceil(102 * .99) = 101: 2400's bucket
  EXPECT_EQ(h.percentile_usec(100), 3'000u);
}

TEST(RemoteLatencyHistogram, OneObservationReadsExactly) {
  RemoteLatencyHistogram h;
  h.observe(317);
  EXPECT_EQ(h.percentile_usec(1), 317u);
  EXPECT_EQ(h.percentile_usec(50), 317u);
  EXPECT_EQ(h.percentile_usec(99), 317u);
  EXPECT_EQ(h.mean_usec(), 317u);
}

TEST(RemoteLatencyHistogram, StatusFiguresAreNamedForTheirHistogram) {
  RemoteLatencyHistogram h;
  h.observe(10);
  h.observe(700);
  std::vector<std::pair<std::string, uint64_t>> figures;
  append_latency_figures("remote_probe", h, figures);
  const std::vector<std::pair<std::string, uint64_t>> expected = {
      {"remote_probe_timed", 2},     {"remote_probe_usec_mean", 355}, {"remote_probe_usec_p50", 50},
      {"remote_probe_usec_p99", 700}, {"remote_probe_usec_max", 700}};
  EXPECT_EQ(figures, expected);
}

}  // namespace
}  // namespace kvpark::daemon
