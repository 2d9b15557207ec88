// LatencyHistogram: Prometheus' cumulative buckets, with the edges exact.
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

}  // namespace
}  // namespace kvpark::daemon
