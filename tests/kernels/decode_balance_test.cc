// BalanceDecodeTiles and StridedMakespan (kernels/paged_attention/decode_balance.h): every tile of
// every unit on exactly one CTA, in stream order, each CTA's share within one tile of the even
// one, and the strided layout's longest CTA.
#include "kernels/paged_attention/decode_balance.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Checks `pieces` against the contract for `tiles` over `slots` CTAs.
void ExpectBalanced(const std::vector<int32_t>& tiles, int slots,
                    const std::vector<DecodeUnitPiece>& pieces) {
  int64_t total = 0;
  for (const int32_t t : tiles) total += t;
  std::vector<int64_t> load(slots, 0);
  size_t k = 0;
  int last_slot = 0;
  for (size_t u = 0; u < tiles.size(); ++u) {
    int32_t next = 0;  // the unit's next tile to cover
    while (next < tiles[u]) {
      ASSERT_LT(k, pieces.size()) << "unit " << u << " uncovered from tile " << next;
      const DecodeUnitPiece& p = pieces[k++];
      ASSERT_EQ(p.unit, static_cast<int32_t>(u));
      ASSERT_EQ(p.tile_begin, next);
      ASSERT_GT(p.tile_end, p.tile_begin) << "empty piece";
      ASSERT_LE(p.tile_end, tiles[u]);
      ASSERT_GE(p.slot, last_slot) << "CTAs out of stream order";
      ASSERT_LT(p.slot, slots);
      last_slot = p.slot;
      load[p.slot] += p.tile_end - p.tile_begin;
      next = p.tile_end;
    }
  }
  EXPECT_EQ(k, pieces.size()) << "pieces past the last unit";
  for (int c = 0; c < slots; ++c) {
    EXPECT_EQ(load[c], total * (c + 1) / slots - total * c / slots) << "CTA " << c;
  }
}

TEST(DecodeBalanceTest, EvenSharesOfEqualUnits) {
  // 128 x 4k at Llama-3-8B's 8 KV heads on an H200: 1024 units of 64 tiles over 264 CTAs.
  const std::vector<int32_t> tiles(1024, 64);
  EXPECT_EQ(StridedMakespan(tiles, 264), 4 * 64);  // 232 CTAs get 4 units, 32 get 3
  std::vector<DecodeUnitPiece> pieces;
  BalanceDecodeTiles(tiles, 264, pieces);
  ExpectBalanced(tiles, 264, pieces);
  int64_t most = 0;
  std::vector<int64_t> load(264, 0);
  for (const DecodeUnitPiece& p : pieces) {
    most = std::max(most, load[p.slot] += p.tile_end - p.tile_begin);
  }
  EXPECT_EQ(most, 249);  // ceil(65536 / 264), against 256 strided
}

TEST(DecodeBalanceTest, RaggedUnitsAndAwkwardCounts) {
  std::mt19937 rng(5);
  for (int slots : {1, 2, 7, 132, 264, 1000}) {
    for (int units : {1, 3, 19, 111, 1000, 2048}) {
      std::vector<int32_t> tiles(units);
      for (int32_t& t : tiles) t = static_cast<int32_t>(rng() % 70);  // zeros included
      SCOPED_TRACE(::testing::Message() << slots << " CTAs, " << units << " units");
      std::vector<DecodeUnitPiece> pieces;
      BalanceDecodeTiles(tiles, slots, pieces);
      ExpectBalanced(tiles, slots, pieces);
    }
  }
}

TEST(DecodeBalanceTest, FewerTilesThanCtasAndNoTiles) {
  std::vector<DecodeUnitPiece> pieces;
  const std::vector<int32_t> few = {1, 0, 2};
  BalanceDecodeTiles(few, 8, pieces);
  ExpectBalanced(few, 8, pieces);
  EXPECT_EQ(pieces.size(), 3u);  // one tile a CTA, unit 1 has none
  const std::vector<int32_t> none = {0, 0};
  BalanceDecodeTiles(none, 4, pieces);
  EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(StridedMakespan(none, 4), 0);
  EXPECT_EQ(StridedMakespan({}, 4), 0);
}

TEST(DecodeBalanceTest, OneLongUnitSpansConsecutiveCtas) {
  const std::vector<int32_t> tiles = {3, 100, 3};
  std::vector<DecodeUnitPiece> pieces;
  BalanceDecodeTiles(tiles, 4, pieces);
  ExpectBalanced(tiles, 4, pieces);
  int long_pieces = 0;
  for (const DecodeUnitPiece& p : pieces) long_pieces += p.unit == 1;
  EXPECT_EQ(long_pieces, 4);  // 26 or 27 tiles a CTA: the long unit is on all four
  EXPECT_EQ(StridedMakespan(tiles, 4), 100);
  EXPECT_EQ(StridedMakespan(tiles, 2), 100);  // CTA 0: units 0 and 2, 6 tiles
}

}  // namespace
}  // namespace tandem
