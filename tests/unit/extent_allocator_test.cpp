// ExtentAllocator: best fit, coalescing, capacity, and the fragmentation behaviour
// its header documents, checked against a granule bitmap model.
#include "shm/extent_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

namespace kvpark::shm {
namespace {

constexpr uint64_t granule = 4096;

uint64_t alloc_or_die(ExtentAllocator& a, uint64_t granules) {
  uint64_t offset = UINT64_MAX;
  EXPECT_TRUE(a.allocate(granules * granule, offset));
  return offset;
}

TEST(ExtentAllocator, StartsAsOneFreeRun) {
  ExtentAllocator a(16 * granule, granule);
  EXPECT_EQ(a.bytes_free(), 16 * granule);
  EXPECT_EQ(a.bytes_used(), 0u);
  EXPECT_EQ(a.largest_free_bytes(), 16 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
}

TEST(ExtentAllocator, ClaimsTakeExactlyTheirRangeAndRefuseAnOverlap) {
  ExtentClaims claims(16 * granule, granule);
  EXPECT_TRUE(claims.claim(4 * granule, 2 * granule));
  EXPECT_FALSE(claims.claim(5 * granule, 2 * granule));   // overlaps the claimed range
  EXPECT_FALSE(claims.claim(3 * granule, 2 * granule));   // overlaps it from below
  EXPECT_FALSE(claims.claim(15 * granule, 2 * granule));  // runs past the end
  EXPECT_FALSE(claims.claim(16 * granule, granule));      // starts at the end
  EXPECT_FALSE(claims.claim(granule + 1, granule));       // not on a granule
  EXPECT_FALSE(claims.claim(0, 0));
  EXPECT_EQ(claims.claimed_bytes(), 2 * granule);
  EXPECT_TRUE(claims.claim(0, 4 * granule));  // the whole range before it
  ExtentAllocator a(16 * granule, granule);
  a.adopt(claims);
  EXPECT_EQ(a.bytes_free(), 10 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 10 * granule);
  a.free(4 * granule, 2 * granule);
  EXPECT_EQ(a.largest_free_bytes(), 12 * granule);  // coalesced with what follows
  EXPECT_EQ(a.free_runs(), 1u);
}

TEST(ExtentAllocator, AdoptingClaimsInAnyOrderLeavesExactlyTheGapsFree) {
  // 200 granules (over three bitmap words); claims straddle the word boundaries.
  constexpr uint64_t granules = 200;
  std::vector<std::pair<uint64_t, uint64_t>> claimed = {
      {150, 50}, {0, 3}, {62, 4}, {127, 2}, {10, 1}, {66, 1}, {100, 27}};
  ExtentClaims claims(granules * granule, granule);
  for (auto [first, count] : claimed) EXPECT_TRUE(claims.claim(first * granule, count * granule));
  ExtentAllocator a(granules * granule, granule);
  a.adopt(claims);
  // Free: [3,10) [11,62) [67,100) [129,150).
  EXPECT_EQ(a.free_runs(), 4u);
  EXPECT_EQ(a.bytes_free(), (7 + 51 + 33 + 21) * granule);
  EXPECT_EQ(a.largest_free_bytes(), 51 * granule);
  uint64_t offset = 0;
  ASSERT_TRUE(a.allocate(7 * granule, offset));  // best fit: exactly the first gap
  EXPECT_EQ(offset, 3 * granule);
  ASSERT_TRUE(a.allocate(21 * granule, offset));
  EXPECT_EQ(offset, 129 * granule);
  EXPECT_FALSE(a.allocate(52 * granule, offset));
}

TEST(ExtentAllocator, ClaimsAgreeWithAGranuleModelAtEveryWordEdge) {
  // Ranges inside one bitmap word (claim()'s one-word path), ending exactly on a word
  // edge, spanning whole words and several: each answer and the claimed total match
  // a plain per-granule model, and adoption frees exactly what the model leaves.
  constexpr uint64_t granules = 320;  // five words
  std::mt19937_64 random(20261203);
  ExtentClaims claims(granules * granule, granule);
  std::vector<bool> taken(granules, false);
  uint64_t taken_count = 0;
  auto model_claim = [&](uint64_t first, uint64_t count) {
    if (count == 0 || first + count > granules) return false;
    for (uint64_t g = first; g < first + count; ++g)
      if (taken[g]) return false;
    for (uint64_t g = first; g < first + count; ++g) taken[g] = true;
    taken_count += count;
    return true;
  };
  const std::vector<std::pair<uint64_t, uint64_t>> edges = {{0, 64},   {64, 1},  {127, 1}, {120, 8},
                                                            {128, 64}, {191, 2}, {250, 70}};
  for (auto [first, count] : edges) {
    EXPECT_EQ(claims.claim(first * granule, count * granule), model_claim(first, count))
        << first << "+" << count;
  }
  for (int i = 0; i < 4000; ++i) {
    const uint64_t first = random() % granules;
    const uint64_t count = 1 + random() % (i % 3 == 0 ? 130 : 6);
    ASSERT_EQ(claims.claim(first * granule, count * granule), model_claim(first, count))
        << "claim " << i << ": " << first << "+" << count;
  }
  EXPECT_EQ(claims.claimed_bytes(), taken_count * granule);
  ExtentAllocator a(granules * granule, granule);
  a.adopt(claims);
  EXPECT_EQ(a.bytes_free(), (granules - taken_count) * granule);
}

TEST(ExtentAllocator, AdoptingNothingLeavesEverythingFreeAndAFullClaimNothing) {
  ExtentAllocator empty(130 * granule, granule);
  empty.adopt(ExtentClaims(130 * granule, granule));
  EXPECT_EQ(empty.bytes_free(), 130 * granule);
  EXPECT_EQ(empty.free_runs(), 1u);
  ExtentClaims all(130 * granule, granule);
  ASSERT_TRUE(all.claim(0, 130 * granule));
  ExtentAllocator full(130 * granule, granule);
  full.adopt(all);
  EXPECT_EQ(full.bytes_free(), 0u);
  EXPECT_EQ(full.free_runs(), 0u);
}

TEST(ExtentAllocator, CarvesFromTheLowEnd) {
  ExtentAllocator a(16 * granule, granule);
  EXPECT_EQ(alloc_or_die(a, 2), 0u);
  EXPECT_EQ(alloc_or_die(a, 3), 2 * granule);
  EXPECT_EQ(a.bytes_used(), 5 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
}

TEST(ExtentAllocator, PicksTheSmallestRunThatFits) {
  // Layout (granules): [0,3) hole | 3 used | [4,5) hole | 5 used | [6,8) hole | 8 used | rest
  ExtentAllocator a(32 * granule, granule);
  const uint64_t h3 = alloc_or_die(a, 3);
  alloc_or_die(a, 1);
  const uint64_t h1 = alloc_or_die(a, 1);
  alloc_or_die(a, 1);
  const uint64_t h2 = alloc_or_die(a, 2);
  alloc_or_die(a, 1);
  a.free(h3, 3 * granule);
  a.free(h1, 1 * granule);
  a.free(h2, 2 * granule);
  ASSERT_EQ(a.free_runs(), 4u);
  uint64_t offset = 0;
  ASSERT_TRUE(a.allocate(2 * granule, offset));
  EXPECT_EQ(offset, h2) << "best fit takes the 2-granule hole, not the first that fits";
  ASSERT_TRUE(a.allocate(1 * granule, offset));
  EXPECT_EQ(offset, h1);
  ASSERT_TRUE(a.allocate(3 * granule, offset));
  EXPECT_EQ(offset, h3);
}

TEST(ExtentAllocator, BreaksSizeTiesByLowestOffset) {
  ExtentAllocator a(16 * granule, granule);
  const uint64_t first = alloc_or_die(a, 2);
  alloc_or_die(a, 1);
  const uint64_t second = alloc_or_die(a, 2);
  alloc_or_die(a, 11);  // arena now full
  a.free(second, 2 * granule);
  a.free(first, 2 * granule);
  uint64_t offset = 0;
  ASSERT_TRUE(a.allocate(2 * granule, offset));
  EXPECT_EQ(offset, first);
}

TEST(ExtentAllocator, CoalescesWithBothNeighbours) {
  ExtentAllocator a(8 * granule, granule);
  const uint64_t left = alloc_or_die(a, 2);
  const uint64_t middle = alloc_or_die(a, 2);
  const uint64_t right = alloc_or_die(a, 2);
  alloc_or_die(a, 2);  // keeps `right` from touching the end of the arena
  a.free(left, 2 * granule);
  a.free(right, 2 * granule);
  EXPECT_EQ(a.free_runs(), 2u);
  a.free(middle, 2 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 6 * granule);
  uint64_t offset = 0;
  ASSERT_TRUE(a.allocate(6 * granule, offset));
  EXPECT_EQ(offset, left);
}

TEST(ExtentAllocator, CoalescesWithLeftNeighbourOnly) {
  ExtentAllocator a(8 * granule, granule);
  const uint64_t left = alloc_or_die(a, 2);
  const uint64_t middle = alloc_or_die(a, 2);
  alloc_or_die(a, 4);
  a.free(left, 2 * granule);
  a.free(middle, 2 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 4 * granule);
}

TEST(ExtentAllocator, CoalescesWithRightNeighbourOnly) {
  ExtentAllocator a(8 * granule, granule);
  alloc_or_die(a, 2);
  const uint64_t middle = alloc_or_die(a, 2);
  const uint64_t right = alloc_or_die(a, 2);
  alloc_or_die(a, 2);
  a.free(right, 2 * granule);
  a.free(middle, 2 * granule);
  EXPECT_EQ(a.free_runs(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 4 * granule);
}

TEST(ExtentAllocator, RejectsAtCapacity) {
  ExtentAllocator a(4 * granule, granule);
  EXPECT_EQ(alloc_or_die(a, 4), 0u);
  EXPECT_EQ(a.bytes_free(), 0u);
  EXPECT_EQ(a.largest_free_bytes(), 0u);
  uint64_t offset = 12345;
  EXPECT_FALSE(a.allocate(granule, offset));
  EXPECT_EQ(offset, 12345u) << "ret_offset stays untouched on failure";
  a.free(0, 4 * granule);
  EXPECT_EQ(a.bytes_free(), 4 * granule);
}

TEST(ExtentAllocator, RejectsMoreThanCapacity) {
  ExtentAllocator a(4 * granule, granule);
  uint64_t offset = 0;
  EXPECT_FALSE(a.allocate(5 * granule, offset));
  EXPECT_EQ(a.bytes_free(), 4 * granule);
}

// Header: "a workload of equal-sized blocks never fragments".
TEST(ExtentAllocator, EqualSizedBlocksNeverFragment) {
  constexpr uint64_t block = 3 * granule;
  ExtentAllocator a(30 * block, granule);
  std::mt19937_64 rng(7);
  std::vector<uint64_t> held;
  for (int round = 0; round < 2000; ++round) {
    if (!held.empty() && (rng() % 2 == 0 || a.bytes_free() < block)) {
      const size_t i = rng() % held.size();
      a.free(held[i], block);
      held[i] = held.back();
      held.pop_back();
    } else {
      uint64_t offset = 0;
      ASSERT_TRUE(a.allocate(block, offset)) << "free bytes " << a.bytes_free();
      held.push_back(offset);
    }
    // Whenever a block's worth of bytes is free, some run holds a whole block.
    if (a.bytes_free() >= block) {
      ASSERT_GE(a.largest_free_bytes(), block);
    }
  }
}

// Header: "mixed sizes can leave holes smaller than a large request".
TEST(ExtentAllocator, MixedSizesCanLeaveUnusableHoles) {
  ExtentAllocator a(8 * granule, granule);
  std::vector<uint64_t> singles;
  for (int i = 0; i < 8; ++i) singles.push_back(alloc_or_die(a, 1));
  for (int i = 0; i < 8; i += 2) a.free(singles[i], granule);  // every other granule
  EXPECT_EQ(a.bytes_free(), 4 * granule);
  EXPECT_EQ(a.largest_free_bytes(), granule);
  uint64_t offset = 0;
  EXPECT_FALSE(a.allocate(2 * granule, offset)) << "4 free granules, none adjacent";
  a.free(singles[1], granule);  // frees the gap between holes 0 and 2
  EXPECT_EQ(a.largest_free_bytes(), 3 * granule);
  EXPECT_TRUE(a.allocate(2 * granule, offset));
  EXPECT_EQ(offset, 0u);
}

// A granule bitmap: the simplest possible model of the allocator's state.
struct BitmapModel {
  std::vector<bool> used;
  struct Run {
    uint64_t start, length;
  };
  std::vector<Run> runs() const {
    std::vector<Run> out;
    for (uint64_t i = 0; i < used.size();) {
      if (used[i]) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < used.size() && !used[j]) ++j;
      out.push_back({i, j - i});
      i = j;
    }
    return out;
  }
  // Best fit: smallest run that holds `length`, lowest offset among equals.
  bool best_fit(uint64_t length, uint64_t& ret_start) const {
    bool found = false;
    uint64_t best_length = 0;
    for (const Run& r : runs()) {
      if (r.length >= length && (!found || r.length < best_length)) {
        found = true;
        best_length = r.length;
        ret_start = r.start;
      }
    }
    return found;
  }
};

TEST(ExtentAllocator, MatchesBitmapModelUnderRandomAllocFree) {
  constexpr uint64_t granules = 256;
  for (uint64_t seed : {1u, 2u, 3u, 4u}) {
    ExtentAllocator a(granules * granule, granule);
    BitmapModel model{std::vector<bool>(granules, false)};
    std::mt19937_64 rng(seed);
    struct Held {
      uint64_t start, length;
    };
    std::vector<Held> held;
    for (int step = 0; step < 4000; ++step) {
      if (!held.empty() && rng() % 100 < 45) {
        const size_t i = rng() % held.size();
        const Held h = held[i];
        held[i] = held.back();
        held.pop_back();
        a.free(h.start * granule, h.length * granule);
        for (uint64_t g = h.start; g < h.start + h.length; ++g) model.used[g] = false;
      } else {
        const uint64_t length = 1 + (rng() % 4 == 0 ? rng() % 40 : rng() % 6);
        uint64_t expected = 0;
        const bool fits = model.best_fit(length, expected);
        uint64_t offset = UINT64_MAX;
        ASSERT_EQ(a.allocate(length * granule, offset), fits) << "seed " << seed << " step " << step;
        if (fits) {
          ASSERT_EQ(offset, expected * granule) << "seed " << seed << " step " << step;
          for (uint64_t g = expected; g < expected + length; ++g) {
            ASSERT_FALSE(model.used[g]);
            model.used[g] = true;
          }
          held.push_back({expected, length});
        } else {
          ASSERT_EQ(offset, UINT64_MAX);
        }
      }
      const auto runs = model.runs();
      uint64_t free_granules = 0, largest = 0;
      for (const auto& r : runs) {
        free_granules += r.length;
        largest = std::max(largest, r.length);
      }
      ASSERT_EQ(a.bytes_free(), free_granules * granule);
      ASSERT_EQ(a.largest_free_bytes(), largest * granule);
      ASSERT_EQ(a.free_runs(), runs.size()) << "adjacent free runs must be coalesced";
    }
    for (const Held& h : held) a.free(h.start * granule, h.length * granule);
    EXPECT_EQ(a.bytes_free(), granules * granule);
    EXPECT_EQ(a.free_runs(), 1u);
  }
}

}  // namespace
}  // namespace kvpark::shm
