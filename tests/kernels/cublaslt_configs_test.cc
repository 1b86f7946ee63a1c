// The enumeration of extra cuBLASLt configurations (kernels/common/cublaslt_configs.h) from
// capabilities, without a device: what the capabilities forbid never appears, splits leave every
// part its minimum depth, the heuristic's own configurations and repeats are dropped, the bound
// holds, and any prefix of the list reaches every allowed split (the round-robin over groups).
#include "kernels/common/cublaslt_configs.h"

#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

LtAlgoCaps Caps(int32_t id, bool splitk, uint32_t mask, bool swizzle, std::vector<uint32_t> tiles,
                std::vector<uint32_t> stages) {
  LtAlgoCaps c;
  c.algo_id = id;
  c.splitk = splitk;
  c.reduction_mask = mask;
  c.swizzle = swizzle;
  c.tiles = std::move(tiles);
  c.stages = std::move(stages);
  return c;
}

std::set<int32_t> Splits(const std::vector<LtAlgoConfig>& configs) {
  std::set<int32_t> s;
  for (const LtAlgoConfig& c : configs) s.insert(c.splitk);
  return s;
}

TEST(LtConfigsTest, NoSplitOrSwizzleWhereTheCapsHaveNone) {
  const auto configs =
      EnumerateLtConfigs({}, {Caps(7, false, 0x7, false, {18, 20, 23}, {36})}, 4096);
  ASSERT_EQ(configs.size(), 3u);
  std::set<uint32_t> tiles;
  for (const LtAlgoConfig& c : configs) {
    EXPECT_EQ(c.splitk, 1);
    EXPECT_EQ(c.reduction, kLtReductionNone);
    EXPECT_EQ(c.swizzle, 0u);
    EXPECT_EQ(c.stages, 36u);
    EXPECT_EQ(c.seed, -1);
    tiles.insert(c.tile);
  }
  EXPECT_EQ(tiles, (std::set<uint32_t>{18, 20, 23}));
}

TEST(LtConfigsTest, SplitsLeaveEveryPartItsMinimumDepth) {
  const std::vector<LtAlgoCaps> caps = {Caps(7, true, kLtReductionComputeType, false, {18}, {36})};
  EXPECT_EQ(Splits(EnumerateLtConfigs({}, caps, 1024)), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(Splits(EnumerateLtConfigs({}, caps, 1000)), (std::set<int32_t>{1}));
  EXPECT_EQ(Splits(EnumerateLtConfigs({}, caps, 4096)), (std::set<int32_t>{1, 2, 3, 4, 6, 8}));
  for (const LtAlgoConfig& c : EnumerateLtConfigs({}, caps, 4096)) {
    EXPECT_EQ(c.reduction, c.splitk == 1 ? kLtReductionNone : kLtReductionComputeType);
  }
}

// The default reductions are compute type only: an algorithm that reduces in place or in the
// output type alone gets no split (those round every partial sum to bf16).
TEST(LtConfigsTest, ReductionSchemesFollowTheMaskAndTheLimits) {
  const std::vector<LtAlgoCaps> inplace_only = {
      Caps(7, true, kLtReductionInplace | kLtReductionOutputType, false, {18}, {36})};
  EXPECT_EQ(Splits(EnumerateLtConfigs({}, inplace_only, 4096)), (std::set<int32_t>{1}));
  LtEnumLimits limits;
  limits.reductions = {kLtReductionComputeType, kLtReductionInplace};
  limits.splits = {2};
  const auto configs = EnumerateLtConfigs({}, inplace_only, 4096, limits);
  ASSERT_EQ(configs.size(), 2u);
  EXPECT_EQ(configs[1].splitk, 2);
  EXPECT_EQ(configs[1].reduction, kLtReductionInplace);
}

TEST(LtConfigsTest, TheHeuristicsConfigurationsAndRepeatsAreDropped) {
  const std::vector<LtAlgoCaps> caps = {
      Caps(7, true, kLtReductionComputeType, true, {18, 20}, {36}),
      Caps(7, true, kLtReductionComputeType, true, {18, 20}, {36})};  // listed twice
  LtAlgoConfig h;
  h.algo_id = 7;
  h.tile = 18;
  h.stages = 36;
  const auto configs = EnumerateLtConfigs({h}, caps, 4096);
  for (size_t i = 0; i < configs.size(); ++i) {
    EXPECT_FALSE(configs[i].SameAs(h)) << LtConfigName(configs[i]);
    for (size_t j = 0; j < i; ++j) {
      EXPECT_FALSE(configs[i].SameAs(configs[j])) << LtConfigName(configs[i]);
    }
  }
  // 2 tiles x 2 swizzles x 6 (split, reduction) groups, less the heuristic's own.
  EXPECT_EQ(configs.size(), 2u * 2u * 6u - 1u);
}

// Variations of a heuristic configuration keep its fields (cluster, inner shape, custom option)
// and come first in their group, before fresh configurations.
TEST(LtConfigsTest, HeuristicVariationsComeFirstAndKeepTheirFields) {
  LtAlgoConfig h;
  h.algo_id = 66;
  h.tile = 20;
  h.stages = 35;
  h.cluster_shape = 3;
  h.inner_shape = 1;
  h.custom = 2;
  const std::vector<LtAlgoCaps> caps = {
      Caps(66, true, kLtReductionComputeType, false, {18, 20}, {36}),
      Caps(9, false, 0, false, {5}, {})};
  const auto configs = EnumerateLtConfigs({h}, caps, 4096);
  ASSERT_GE(configs.size(), 6u);
  // The first round: split 1's first fresh config (the heuristic's own variation at split 1 is
  // itself, dropped), then the heuristic's configuration at each split.
  EXPECT_EQ(configs[0].splitk, 1);
  EXPECT_EQ(configs[0].seed, -1);
  for (int i = 1; i <= 5; ++i) {
    EXPECT_EQ(configs[i].seed, 0) << LtConfigName(configs[i]);
    EXPECT_EQ(configs[i].cluster_shape, 3);
    EXPECT_EQ(configs[i].inner_shape, 1);
    EXPECT_EQ(configs[i].custom, 2u);
    EXPECT_EQ(configs[i].tile, 20u);
    EXPECT_GT(configs[i].splitk, 1);
  }
  // The algorithm without split support still gets its tile, with no stages (undefined).
  bool found = false;
  for (const LtAlgoConfig& c : configs) {
    if (c.algo_id != 9) continue;
    found = true;
    EXPECT_EQ(c.splitk, 1);
    EXPECT_EQ(c.tile, 5u);
    EXPECT_EQ(c.stages, 0u);
  }
  EXPECT_TRUE(found);
}

TEST(LtConfigsTest, UndefinedIdsAreDroppedAndStagesBounded) {
  const auto configs =
      EnumerateLtConfigs({}, {Caps(3, false, 0, false, {0, 11}, {36, 21, 22, 0})}, 4096);
  ASSERT_EQ(configs.size(), 2u);  // one tile x the first two stages
  EXPECT_EQ(configs[0].tile, 11u);
  EXPECT_EQ(configs[0].stages, 36u);
  EXPECT_EQ(configs[1].stages, 21u);
  const auto undefined = EnumerateLtConfigs({}, {Caps(3, false, 0, false, {}, {})}, 4096);
  ASSERT_EQ(undefined.size(), 1u);
  EXPECT_EQ(undefined[0].tile, 0u);
  EXPECT_EQ(undefined[0].stages, 0u);
}

// Many tiles: the bound holds, and the first round already reaches every split.
TEST(LtConfigsTest, TheBoundHoldsAndEveryPrefixReachesEverySplit) {
  std::vector<uint32_t> tiles;
  for (uint32_t t = 1; t <= 200; ++t) tiles.push_back(t);
  const std::vector<LtAlgoCaps> caps = {
      Caps(1, true, kLtReductionComputeType, true, tiles, {36, 37}),
      Caps(2, true, kLtReductionComputeType, true, tiles, {36})};
  LtEnumLimits limits;
  limits.max_configs = 64;
  const auto configs = EnumerateLtConfigs({}, caps, 14336, limits);
  EXPECT_EQ(configs.size(), 64u);
  const std::vector<LtAlgoConfig> first(configs.begin(), configs.begin() + 6);
  EXPECT_EQ(Splits(first), (std::set<int32_t>{1, 2, 3, 4, 6, 8}));
  // Both algorithm ids appear early (tiles interleave across ids).
  std::set<int32_t> ids;
  for (size_t i = 0; i < 12; ++i) ids.insert(configs[i].algo_id);
  EXPECT_EQ(ids, (std::set<int32_t>{1, 2}));
  EXPECT_TRUE(EnumerateLtConfigs({}, caps, 14336, LtEnumLimits{.max_configs = 0}).empty());
}

TEST(LtConfigsTest, NamesCarryEveryConfiguredField) {
  LtAlgoConfig c;
  c.algo_id = 66;
  c.tile = 20;
  c.stages = 36;
  c.splitk = 2;
  c.reduction = kLtReductionComputeType;
  EXPECT_EQ(LtConfigName(c), "algo 66 tile 20 stages 36 splitk 2 red 2 swz 0");
  c.cluster_shape = 3;
  EXPECT_EQ(LtConfigName(c), "algo 66 tile 20 stages 36 splitk 2 red 2 swz 0 cluster 3");
  EXPECT_EQ(LtCapsName(Caps(5, true, 7, false, {1, 2}, {3})),
            "algo 5: splitk yes, reductions 0x7, swizzle no, 2 tiles, 1 stages");
}

}  // namespace
}  // namespace tandem
