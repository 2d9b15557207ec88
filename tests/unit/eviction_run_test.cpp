// cheapest_run: the stretch of free space and evictable entries a large extent takes
// from a fragmented arena.
#include "daemon/eviction_run.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvpark::daemon {
namespace {

// Pieces laid end to end from offset 0: 'f' free, 'e' evictable (cost `costs[i]`, or
// its bytes), 'x' not evictable; each `unit` bytes.
std::vector<ArenaPiece> lay_out(const std::string& kinds, std::vector<double> costs = {},
                                uint64_t unit = 1) {
  std::vector<ArenaPiece> pieces;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const bool entry = kinds[i] != 'f';
    pieces.push_back(ArenaPiece{.offset = i * unit,
                                .bytes = unit,
                                .slot = entry ? EntrySlot(i) : no_slot,
                                .evictable = kinds[i] != 'x',
                                .cost = !entry           ? 0.0
                                        : i < costs.size() ? costs[i]
                                                           : double(unit)});
  }
  return pieces;
}

std::pair<size_t, size_t> run_of(const std::vector<ArenaPiece>& pieces, uint64_t bytes) {
  size_t first = 99, end = 99;
  EXPECT_TRUE(cheapest_run(pieces, bytes, &first, &end));
  return {first, end};
}

TEST(CheapestRun, TakesTheStretchWithTheMostFreeSpace) {
  // Evicting 'e's costs their bytes: the two adjacent holes cost nothing.
  EXPECT_EQ(run_of(lay_out("efeffe"), 2), (std::pair<size_t, size_t>{3, 5}));
}

TEST(CheapestRun, NeverCrossesWhatMayNotBeEvicted) {
  EXPECT_EQ(run_of(lay_out("ffxeexff"), 2), (std::pair<size_t, size_t>{0, 2}));
  EXPECT_EQ(run_of(lay_out("fxfxeex"), 2), (std::pair<size_t, size_t>{4, 6}));
  size_t first = 0, end = 0;
  EXPECT_FALSE(cheapest_run(lay_out("fxfxfxf"), 2, &first, &end));
}

TEST(CheapestRun, NeverCrossesAGapBetweenPieces) {
  std::vector<ArenaPiece> pieces = lay_out("eeee");
  pieces[2].offset += 5;  // something not in the list lies between 1 and 2
  pieces[3].offset += 5;
  EXPECT_EQ(run_of(pieces, 2), (std::pair<size_t, size_t>{0, 2}));
  size_t first = 0, end = 0;
  EXPECT_FALSE(cheapest_run(pieces, 3, &first, &end));
}

TEST(CheapestRun, PrefersTheEntriesWorthLeast) {
  // Two equal stretches: the one whose entries are worth less goes.
  EXPECT_EQ(run_of(lay_out("eeee", {9, 9, 1, 1}), 2), (std::pair<size_t, size_t>{2, 4}));
}

TEST(CheapestRun, TakesAtMostTheNeedPlusOnePiece) {
  // Pieces of 4 bytes; 9 bytes need three of them, never four.
  const std::vector<ArenaPiece> pieces = lay_out("eeeeeeee", {}, 4);
  const auto [first, end] = run_of(pieces, 9);
  EXPECT_EQ(end - first, 3u);
}

TEST(CheapestRun, OfEqualCostEvictsFewerBytes) {
  // Entries worth nothing: [e e] and [e f] cost the same; the one with the hole wins.
  EXPECT_EQ(run_of(lay_out("eef", {0, 0}), 2), (std::pair<size_t, size_t>{1, 3}));
}

}  // namespace
}  // namespace kvpark::daemon
