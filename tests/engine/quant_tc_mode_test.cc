// The CUDA backend's switch for the mixed-input tensor-core INT8 / UINT4 GEMM
// (engine/cuda/quant_tc_mode.h), without a device (label cpu): the environment value's parse (a
// typo is an error, not the other side of an A/B) and which quantized GEMMs it applies to.
#include "engine/cuda/quant_tc_mode.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(QuantTcModeTest, ParsesTheSwitch) {
  EXPECT_EQ(*ParseQuantTc(nullptr), kQuantTcDefault);
  EXPECT_EQ(*ParseQuantTc("0"), QuantTc::kOff);
  EXPECT_EQ(*ParseQuantTc("1"), QuantTc::kOn);
  EXPECT_EQ(*ParseQuantTc("require"), QuantTc::kRequire);
  for (const char* bad : {"", "2", "on", "off", "1 ", "Require"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseQuantTc(bad).status())) << "'" << bad << "'";
  }
}

TEST(QuantTcModeTest, AppliesToInt8AndUint4StepsBetweenTheSkinnyKernelAndItsMaximum) {
  for (QuantTc on : {QuantTc::kOn, QuantTc::kRequire}) {
    for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
      EXPECT_TRUE(QuantTcApplies(on, code, kQuantSkinnyMaxM + 1));
      EXPECT_TRUE(QuantTcApplies(on, code, kQuantTcMaxM));
      EXPECT_FALSE(QuantTcApplies(on, code, kQuantSkinnyMaxM));  // the skinny kernel's
      EXPECT_FALSE(QuantTcApplies(on, code, 1));
      EXPECT_FALSE(QuantTcApplies(on, code, kQuantTcMaxM + 1));  // prefill: dequantize + GEMM
    }
    EXPECT_FALSE(QuantTcApplies(on, QuantCode::kFp8E4M3, 16));  // FP8 has its own paths
  }
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, QuantCode::kInt8, 16));
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, QuantCode::kUint4, 16));
}

}  // namespace
}  // namespace tandem
