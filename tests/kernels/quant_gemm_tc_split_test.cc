// QuantGemmTc's split-K plan (kernels/quant_gemm/quant_gemm_tc_split.h) without a device (label
// cpu): splits cover k exactly with no empty split, boundaries on groups, forced counts honoured,
// and the automatic plan splits the n = 4096 shapes of an 8B model on an H100 (132 SMs) whose rows
// give two splits of 4+ chunks a warp, while leaving QKV, gate-up (896 row tiles) and the
// one-block-per-SM 64-token tile of O alone.
#include "kernels/quant_gemm/quant_gemm_tc_split.h"

#include <cstdint>
#include <tuple>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int kH100Sms = 132;

// int8 (64-k chunks) or uint4 (128-k chunks) weight [n, k], group (k: per channel), m_tile tokens.
QuantTcSplitShape Shape(bool uint4, int64_t n, int64_t k, int64_t group, int64_t m_tile,
                        int blocks_per_sm) {
  const int64_t chunk = uint4 ? 128 : 64;
  return {.n = n,
          .m_tile = m_tile,
          .num_chunks = k / chunk,
          .unit_chunks = group == k ? 1 : group / chunk,
          .row_bytes = uint4 ? k / 2 : k,
          .sms = kH100Sms,
          .blocks_per_sm = blocks_per_sm};
}

void ExpectWellFormed(const QuantTcSplitShape& s, const QuantTcSplitPlan& p) {
  ASSERT_GE(p.splits, 1);
  ASSERT_LE(p.splits, kQuantTcMaxSplits);
  EXPECT_TRUE(p.chunks_per_split % s.unit_chunks == 0 || p.splits == 1)
      << "a split boundary inside a group";
  EXPECT_GE(p.chunks_per_split * p.splits, s.num_chunks) << "chunks left out";
  EXPECT_LT(p.chunks_per_split * (p.splits - 1), s.num_chunks) << "an empty split";
}

TEST(QuantTcSplitTest, ForcedCountsCoverKOnGroupBoundaries) {
  for (bool uint4 : {false, true}) {
    for (int64_t k : {int64_t{512}, int64_t{1152}, int64_t{4096}, int64_t{14336}}) {
      for (int64_t group : {k, int64_t{128}, int64_t{256}}) {
        if (group != k && (group % (uint4 ? 128 : 64) != 0)) continue;
        for (int forced = 1; forced <= kQuantTcMaxSplits; ++forced) {
          const QuantTcSplitShape s = Shape(uint4, 4096, k, group, 8, 2);
          const QuantTcSplitPlan p = PlanQuantTcSplit(s, forced);
          SCOPED_TRACE(::testing::Message() << "uint4 " << uint4 << " k " << k << " group " << group
                                            << " forced " << forced);
          ExpectWellFormed(s, p);
          EXPECT_LE(p.splits, forced);
          const int64_t units = (s.num_chunks + s.unit_chunks - 1) / s.unit_chunks;
          if (units >= forced && units % forced == 0) {
            EXPECT_EQ(p.splits, forced);
          }
          if (units >= 2 && forced >= 2) {
            EXPECT_GE(p.splits, 2);
          }
        }
      }
    }
  }
  // k = 448 int8 per 128-group: 4 groups (2, 2, 2, 1 chunks). 3 forced splits take ceil(4 / 3) = 2
  // groups each, so only 2 splits come out (4 and 3 chunks): never a boundary inside a group.
  const QuantTcSplitShape s{.n = 200, .num_chunks = 7, .unit_chunks = 2, .row_bytes = 448};
  const QuantTcSplitPlan p = PlanQuantTcSplit(s, 3);
  EXPECT_EQ(p.chunks_per_split, 4);
  EXPECT_EQ(p.splits, 2);
  // 8 forced splits of a per-channel row of 7 chunks: 7 splits of one chunk.
  const QuantTcSplitPlan q =
      PlanQuantTcSplit({.n = 200, .num_chunks = 7, .unit_chunks = 1, .row_bytes = 448}, 8);
  EXPECT_EQ(q.splits, 7);
  EXPECT_EQ(q.chunks_per_split, 1);
}

TEST(QuantTcSplitTest, AutomaticPlanSplitsTheNarrowShapes) {
  // m_tile 8 (2 blocks per SM): the rows long enough for two splits of 4+ chunks a warp split —
  // O int8 per channel, down and 12288 -> 4096 int8 and int4 group 128 (the shapes measured
  // faster split, WORKLOG.md step 8).
  for (auto [uint4, n, k] : {std::tuple<bool, int64_t, int64_t>{false, 4096, 4096},
                             {false, 4096, 14336},
                             {false, 4096, 12288},
                             {true, 4096, 14336},
                             {true, 4096, 12288}}) {
    const QuantTcSplitShape s = Shape(uint4, n, k, uint4 ? 128 : k, 8, 2);
    const QuantTcSplitPlan p = PlanQuantTcSplit(s, 0);
    SCOPED_TRACE(::testing::Message() << "uint4 " << uint4 << " n " << n << " k " << k);
    ExpectWellFormed(s, p);
    EXPECT_GE(p.splits, 2);
    EXPECT_GE(p.chunks_per_split, kQuantTcMinSplitChunks);
    EXPECT_EQ(p.chunks_per_split % kQuantTcBlockWarps, 0) << "warps unevenly loaded";
    EXPECT_LT(QuantTcPlanCost(s, p), QuantTcPlanCost(s, {1, s.num_chunks}));
  }
  // O at 128 tiles, 264 block slots: two splits fill one wave exactly.
  EXPECT_EQ(PlanQuantTcSplit(Shape(false, 4096, 4096, 4096, 8, 2), 0).splits, 2);
}

// Splits shorter than 4 chunks a warp are never chosen: QKV int8 (64 chunks: two splits would
// take two waves, four splits 16 chunks each, measured 24-32% slower) and the int4 rows of
// k = 4096 (32 chunks) stay whole.
TEST(QuantTcSplitTest, AutomaticPlanKeepsSplitsLong) {
  EXPECT_EQ(PlanQuantTcSplit(Shape(false, 6144, 4096, 4096, 8, 2), 0).splits, 1);
  EXPECT_EQ(PlanQuantTcSplit(Shape(true, 6144, 4096, 128, 8, 2), 0).splits, 1);
  EXPECT_EQ(PlanQuantTcSplit(Shape(true, 4096, 4096, 128, 8, 2), 0).splits, 1);
  EXPECT_EQ(PlanQuantTcSplit(Shape(false, 4096, 1024, 1024, 8, 2), 0).splits, 1);
}

TEST(QuantTcSplitTest, AutomaticPlanLeavesWideOrFullShapesAlone) {
  for (int64_t m_tile : {8, 16, 32, 64}) {
    // gate-up: 896 row tiles, already several per SM.
    EXPECT_EQ(PlanQuantTcSplit(Shape(false, 28672, 4096, 4096, m_tile, 2), 0).splits, 1);
    EXPECT_EQ(PlanQuantTcSplit(Shape(true, 28672, 4096, 128, m_tile, 2), 0).splits, 1);
  }
  // O at the 64-token tile, one block per SM: 128 tiles are one wave already; a split only adds
  // waves and partials.
  EXPECT_EQ(PlanQuantTcSplit(Shape(false, 4096, 4096, 4096, 64, 1), 0).splits, 1);
  // Too few chunks to give every warp of every split one (k = 448 int8: 7 chunks).
  EXPECT_EQ(PlanQuantTcSplit(Shape(false, 200, 448, 448, 8, 2), 0).splits, 1);
}

TEST(QuantTcSplitTest, PartialFloatsFollowThePlan) {
  const QuantTcSplitShape s = Shape(false, 4100, 4096, 4096, 16, 2);  // 129 tiles
  EXPECT_EQ(QuantTcPartialFloats(s, {1, 64}), 0);
  EXPECT_EQ(QuantTcPartialFloats(s, {3, 22}), 3 * 129 * 32 * 16);
}

}  // namespace
}  // namespace tandem
