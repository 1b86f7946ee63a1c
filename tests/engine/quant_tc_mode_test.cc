// The CUDA backend's switch for the mixed-input tensor-core INT8 / UINT4 GEMM
// (engine/cuda/quant_tc_mode.h), without a device (label cpu): the environment value's parse (a
// typo is an error, not the other side of an A/B) and which quantized GEMMs it applies to, with
// and without TANDEM_QUANT_TC_SMALL_M.
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

TEST(QuantTcModeTest, ParsesTheSmallMSwitch) {
  EXPECT_EQ(*ParseQuantTcSmallM(nullptr), kQuantTcSmallMDefault);
  EXPECT_FALSE(kQuantTcSmallMDefault);  // measured slower at batch 1 (WORKLOG.md step 8)
  EXPECT_FALSE(*ParseQuantTcSmallM("0"));
  EXPECT_TRUE(*ParseQuantTcSmallM("1"));
  for (const char* bad : {"", "2", "on", "require", "1 ", "true"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseQuantTcSmallM(bad).status())) << "'" << bad << "'";
  }
}

// TANDEM_QUANT_TC_SPLIT maps onto QuantGemmArgs::tc_splits: unset and "1" the automatic plan (0),
// "0" never split (1).
TEST(QuantTcModeTest, ParsesTheSplitSwitch) {
  EXPECT_EQ(*ParseQuantTcSplit(nullptr), 0);
  EXPECT_EQ(*ParseQuantTcSplit("1"), 0);
  EXPECT_EQ(*ParseQuantTcSplit("0"), 1);
  for (const char* bad : {"", "2", "auto", "off", "0 ", "false"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseQuantTcSplit(bad).status())) << "'" << bad << "'";
  }
}

TEST(QuantTcModeTest, AppliesToInt8AndUint4StepsBetweenTheSkinnyKernelAndItsMaximum) {
  for (QuantTc on : {QuantTc::kOn, QuantTc::kRequire}) {
    for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
      EXPECT_TRUE(QuantTcApplies(on, false, code, kQuantSkinnyMaxM + 1));
      EXPECT_TRUE(QuantTcApplies(on, false, code, kQuantTcMaxM));
      EXPECT_FALSE(QuantTcApplies(on, false, code, kQuantSkinnyMaxM));  // the skinny kernel's
      EXPECT_FALSE(QuantTcApplies(on, false, code, 1));
      EXPECT_FALSE(QuantTcApplies(on, false, code, kQuantTcMaxM + 1));  // prefill: dequantize
    }
    EXPECT_FALSE(QuantTcApplies(on, false, QuantCode::kFp8E4M3, 16));  // FP8 has its own paths
  }
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, false, QuantCode::kInt8, 16));
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, false, QuantCode::kUint4, 16));
}

TEST(QuantTcModeTest, SmallMTakesTheSkinnyKernelsStepsToo) {
  for (QuantTc on : {QuantTc::kOn, QuantTc::kRequire}) {
    for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
      for (int64_t m = 1; m <= kQuantSkinnyMaxM; ++m) {
        EXPECT_TRUE(QuantTcApplies(on, true, code, m)) << m;
        EXPECT_FALSE(QuantTcApplies(on, false, code, m)) << m;
      }
      EXPECT_TRUE(QuantTcApplies(on, true, code, kQuantTcMaxM));
      EXPECT_FALSE(QuantTcApplies(on, true, code, 0));
      EXPECT_FALSE(QuantTcApplies(on, true, code, kQuantTcMaxM + 1));
    }
    EXPECT_FALSE(QuantTcApplies(on, true, QuantCode::kFp8E4M3, 1));  // FP8 keeps the skinny kernel
  }
  // TANDEM_QUANT_TC=0 turns the kernel off at every m, small_m or not.
  for (int64_t m : {int64_t{1}, kQuantSkinnyMaxM, int64_t{16}}) {
    EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, true, QuantCode::kInt8, m)) << m;
  }
}

}  // namespace
}  // namespace tandem
