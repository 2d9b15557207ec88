// LatencyHistogram: Prometheus' cumulative buckets, with the edges exact.
// RemoteLatencyHistogram: microsecond buckets, percentiles read from them at the edges
// (a bucket's bound, empty, the overflow bucket).
#include <gtest/gtest.h>

#include "daemon/control.h"

namespace kvpark::daemon {
namespace {

TEST(LatencyHistogram, BucketsAreCumulativeAndInclusiveAtTheirBound) {
  LatencyHistogram h;
  h.observe(0.0005);  // exactly the first bound: counted in it
  h.observe(0.003);   // between 0.0025 and 0.005
  h.observe(20.0);    // past every bound: only in +Inf (count)
  EXPECT_EQ(h.count, 3u);
  EXPECT_DOUBLE_EQ(h.sum_seconds, 20.0035);
  EXPECT_EQ(h.buckets[0], 1u);                                  // <= 0.0005
  EXPECT_EQ(h.buckets[2], 1u);                                  // <= 0.0025
  EXPECT_EQ(h.buckets[3], 2u);                                  // <= 0.005
  EXPECT_EQ(h.buckets[LatencyHistogram::bucket_count - 1], 2u);  // <= 10
  for (size_t i = 1; i < LatencyHistogram::bucket_count; ++i) {
    EXPECT_LE(h.buckets[i - 1], h.buckets[i]) << "not cumulative at " << i;
  }
}

TEST(LatencyHistogram, BoundsIncrease) {
  for (size_t i = 1; i < LatencyHistogram::bucket_count; ++i) {
    EXPECT_LT(LatencyHistogram::bounds_seconds[i - 1], LatencyHistogram::bounds_seconds[i]);
  }
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
