// The CUDA backend's switch for the RMSNorm fused with the FP8 activation quantization
// (engine/cuda/fused_act_quant.h), without a device (label cpu): the environment value's parse
// (a typo is an error, not the other side of an A/B) and when a step fuses.
#include "engine/cuda/fused_act_quant.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(FusedActQuantTest, ParsesTheSwitch) {
  EXPECT_EQ(*ParseFusedActQuant(nullptr), kFusedActQuantDefault);
  EXPECT_EQ(*ParseFusedActQuant("0"), FusedActQuant::kOff);
  EXPECT_EQ(*ParseFusedActQuant("1"), FusedActQuant::kOn);
  EXPECT_EQ(*ParseFusedActQuant("require"), FusedActQuant::kRequire);
  for (const char* bad : {"", "2", "on", "true", "1 ", "Require"}) {
    const absl::StatusOr<FusedActQuant> got = ParseFusedActQuant(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << "'" << bad << "'";
  }
}

TEST(FusedActQuantTest, FusesOnlyWhenOnWithFp8WeightsAndAboveTheSkinnyKernel) {
  for (FusedActQuant on : {FusedActQuant::kOn, FusedActQuant::kRequire}) {
    EXPECT_TRUE(FusesNormForFp8Activations(on, true, true, kQuantSkinnyMaxM + 1));
    EXPECT_TRUE(FusesNormForFp8Activations(on, true, true, 8192));
    EXPECT_FALSE(FusesNormForFp8Activations(on, true, true, kQuantSkinnyMaxM));  // skinny kernel
    EXPECT_FALSE(FusesNormForFp8Activations(on, true, true, 1));
    EXPECT_FALSE(FusesNormForFp8Activations(on, false, true, 64));  // no cuBLASLt FP8 weight
    EXPECT_FALSE(FusesNormForFp8Activations(on, true, false, 64));  // no fallback scratch
  }
  EXPECT_FALSE(FusesNormForFp8Activations(FusedActQuant::kOff, true, true, 64));
}

}  // namespace
}  // namespace tandem
