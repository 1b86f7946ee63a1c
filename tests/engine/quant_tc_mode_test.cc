// The CUDA backend's switch for the mixed-input tensor-core INT8 / UINT4 GEMM
// (engine/cuda/quant_tc_mode.h), without a device (label cpu): the environment value's parse (a
// typo is an error, not the other side of an A/B) and which quantized GEMMs it applies to, with
// TANDEM_QUANT_TC_MIN_M; the same for the GEMV's switch (TANDEM_QUANT_GEMV).
#include "engine/cuda/quant_tc_mode.h"

#include "absl/strings/str_cat.h"
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

TEST(QuantTcModeTest, ParsesTheMinMSwitch) {
  EXPECT_EQ(*ParseQuantTcMinM(nullptr), kQuantTcMinMDefault);
  EXPECT_EQ(kQuantTcMinMDefault, 2);  // the skinny kernel keeps batch 1 (WORKLOG.md step 10)
  for (int64_t m = 1; m <= kQuantSkinnyMaxM + 1; ++m) {
    EXPECT_EQ(*ParseQuantTcMinM(absl::StrCat(m).c_str()), m);
  }
  for (const char* bad : {"", "0", "6", "-1", "2 ", "two", "1.5"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseQuantTcMinM(bad).status())) << "'" << bad << "'";
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

TEST(QuantTcModeTest, ParsesTheGemvSwitch) {
  EXPECT_EQ(*ParseQuantGemv(nullptr), kQuantGemvDefault);
  EXPECT_FALSE(*ParseQuantGemv("0"));
  EXPECT_TRUE(*ParseQuantGemv("1"));
  for (const char* bad : {"", "2", "on", "require", "0 ", "false"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseQuantGemv(bad).status())) << "'" << bad << "'";
  }
}

// The GEMV takes INT8 / UINT4 steps of 1..kQuantGemvMaxM tokens when on, nothing when off, and
// never FP8.
TEST(QuantTcModeTest, GemvAppliesToInt8AndUint4DecodeSteps) {
  for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
    EXPECT_TRUE(QuantGemvApplies(true, code, 1));
    EXPECT_TRUE(QuantGemvApplies(true, code, kQuantGemvMaxM));
    EXPECT_FALSE(QuantGemvApplies(true, code, 0));
    EXPECT_FALSE(QuantGemvApplies(true, code, kQuantGemvMaxM + 1));  // QuantGemmTc's
    EXPECT_FALSE(QuantGemvApplies(false, code, 1));
  }
  EXPECT_FALSE(QuantGemvApplies(true, QuantCode::kFp8E4M3, 1));
}

TEST(QuantTcModeTest, AppliesToInt8AndUint4StepsFromMinMToItsMaximum) {
  for (QuantTc on : {QuantTc::kOn, QuantTc::kRequire}) {
    for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
      const int64_t min_m = kQuantTcMinMDefault;
      EXPECT_TRUE(QuantTcApplies(on, min_m, code, min_m));
      EXPECT_TRUE(QuantTcApplies(on, min_m, code, kQuantSkinnyMaxM));
      EXPECT_TRUE(QuantTcApplies(on, min_m, code, kQuantTcMaxM));
      EXPECT_FALSE(QuantTcApplies(on, min_m, code, 1));                 // the skinny kernel's
      EXPECT_FALSE(QuantTcApplies(on, min_m, code, kQuantTcMaxM + 1));  // prefill: dequantize
    }
    EXPECT_FALSE(QuantTcApplies(on, 2, QuantCode::kFp8E4M3, 16));  // FP8 has its own paths
  }
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, 2, QuantCode::kInt8, 16));
  EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, 2, QuantCode::kUint4, 16));
}

// TANDEM_QUANT_TC_MIN_M=1 gives it batch 1 as well; =5 leaves the skinny kernel all of its range.
TEST(QuantTcModeTest, MinMMovesTheLowerEnd) {
  for (QuantTc on : {QuantTc::kOn, QuantTc::kRequire}) {
    for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
      for (int64_t m = 1; m <= kQuantSkinnyMaxM; ++m) {
        EXPECT_TRUE(QuantTcApplies(on, 1, code, m)) << m;
        EXPECT_FALSE(QuantTcApplies(on, kQuantSkinnyMaxM + 1, code, m)) << m;
      }
      EXPECT_TRUE(QuantTcApplies(on, kQuantSkinnyMaxM + 1, code, kQuantSkinnyMaxM + 1));
      EXPECT_FALSE(QuantTcApplies(on, 1, code, 0));
      EXPECT_FALSE(QuantTcApplies(on, 1, code, kQuantTcMaxM + 1));
    }
    EXPECT_FALSE(QuantTcApplies(on, 1, QuantCode::kFp8E4M3, 1));  // FP8 keeps the skinny kernel
  }
  // TANDEM_QUANT_TC=0 turns the kernel off at every m, whatever min_m.
  for (int64_t m : {int64_t{1}, kQuantSkinnyMaxM, int64_t{16}}) {
    EXPECT_FALSE(QuantTcApplies(QuantTc::kOff, 1, QuantCode::kInt8, m)) << m;
  }
}

}  // namespace
}  // namespace tandem
