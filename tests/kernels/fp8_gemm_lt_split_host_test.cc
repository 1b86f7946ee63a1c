// The FP8 split-k's host half (kernels/quant_gemm/fp8_gemm_lt_split.h), without a device: which
// calls qualify, the parts of k (contiguous, covering k exactly, boundaries at multiples of 128,
// each at least the minimum), and the switch.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"

namespace tandem {
namespace {

void ExpectCovers(const std::vector<Fp8LtSplitPart>& parts, int64_t k, int splits) {
  ASSERT_EQ(static_cast<int>(parts.size()), splits) << "k " << k;
  int64_t next = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    EXPECT_EQ(parts[s].k0, next) << "k " << k << " part " << s;
    EXPECT_EQ(parts[s].k0 % kFp8LtSplitAlign, 0);
    EXPECT_GE(parts[s].k, kFp8LtSplitMinK);
    if (s + 1 < parts.size()) {
      EXPECT_EQ(parts[s].k % kFp8LtSplitAlign, 0);
    }
    if (s > 0) {
      EXPECT_LE(parts[s].k, parts[s - 1].k + kFp8LtSplitAlign);
    }
    next += parts[s].k;
  }
  EXPECT_EQ(next, k);
}

TEST(Fp8LtSplitTest, PartsCoverKAtBlockBoundaries) {
  for (int splits : {2, 3, 4}) {
    for (int64_t k : {4096, 14336, 2048, 2064, 4096 + 16, 1536 * 4}) {
      if (k / splits < kFp8LtSplitMinK) continue;
      ExpectCovers(Fp8LtSplitParts(256, 4096, k, true, splits), k, splits);
    }
  }
  const std::vector<Fp8LtSplitPart> three = Fp8LtSplitParts(256, 4096, 4096, true, 3);
  ASSERT_EQ(three.size(), 3u);  // 32 blocks of 128: 11, 11, 10
  EXPECT_EQ(three[0].k, 11 * 128);
  EXPECT_EQ(three[1].k, 11 * 128);
  EXPECT_EQ(three[2].k, 10 * 128);
}

TEST(Fp8LtSplitTest, OnlyQualifyingCallsSplit) {
  EXPECT_FALSE(Fp8LtSplitParts(256, 4096, 4096, true, 2).empty());
  EXPECT_FALSE(Fp8LtSplitParts(68, 4096, 4096, true, 2).empty());
  EXPECT_FALSE(Fp8LtSplitParts(512, 8192, 4096, true, 4).empty());
  EXPECT_TRUE(Fp8LtSplitParts(256, 4096, 4096, true, 1).empty());         // off
  EXPECT_TRUE(Fp8LtSplitParts(256, 4096, 4096, true, 0).empty());         // off
  EXPECT_TRUE(Fp8LtSplitParts(256, 4096, 4096, true, 5).empty());         // beyond the streams
  EXPECT_TRUE(Fp8LtSplitParts(256, 4096, 4096, false, 2).empty());        // block scales
  EXPECT_TRUE(Fp8LtSplitParts(64, 4096, 4096, true, 2).empty());          // weight-bound rows
  EXPECT_TRUE(Fp8LtSplitParts(516, 4096, 4096, true, 2).empty());         // many tiles already
  EXPECT_TRUE(Fp8LtSplitParts(258, 4096, 4096, true, 2).empty());         // m % 4 != 0
  EXPECT_TRUE(Fp8LtSplitParts(256, 28672, 4096, true, 2).empty());        // gate-up: many tiles
  EXPECT_TRUE(Fp8LtSplitParts(256, 4096, 1024 + 1008, true, 4).empty());  // parts under 512
}

TEST(Fp8LtSplitTest, TheSwitchTakesTwoToFourAndRestores) {
  const int before = Fp8LtSplitK();
  {
    ScopedFp8LtSplitK two(2);
    EXPECT_EQ(Fp8LtSplitK(), 2);
    SetFp8LtSplitK(4);
    EXPECT_EQ(Fp8LtSplitK(), 4);
    SetFp8LtSplitK(7);
    EXPECT_EQ(Fp8LtSplitK(), 0);
    SetFp8LtSplitK(1);
    EXPECT_EQ(Fp8LtSplitK(), 0);
  }
  EXPECT_EQ(Fp8LtSplitK(), before);
}

}  // namespace
}  // namespace tandem
