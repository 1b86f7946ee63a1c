// rmsnorm_quant.h without a device (label cpu): the reference quantizer's codes and scales are
// QuantizeActivationRow's rounding bit for bit (the FP8 GEMM's reference, QuantGemmRef, rounds
// activations with it), in the cuBLASLt FP8 scratch layout (pad rows zero codes, scale 1; the
// block modes' tail scales), and RmsNormQuantCovers refuses what the fused kernel cannot take.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "kernels/rmsnorm/rmsnorm_quant.h"

namespace tandem {
namespace {

float ScaleAt(const std::vector<uint8_t>& bytes, const Fp8LtScratchLayout& l, int64_t i,
              int64_t g) {
  int64_t off;
  if (!l.block) {
    off = l.scales + 4 * i;
  } else if (i < l.main_rows) {
    off = l.scales + 4 * (g * l.main_rows + i);
  } else {
    off = l.tail_scales + 4 * (g * kFp8LtTailRows + (i - l.tail_start));
  }
  float s;
  std::memcpy(&s, &bytes[off], 4);
  return s;
}

TEST(RmsNormQuantRefTest, QuantizerIsTheReferenceRoundingInTheScratchLayout) {
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    for (int64_t m : {1, 3, 5, 17}) {
      for (int64_t k : {128, 400, 1024}) {
        SCOPED_TRACE(::testing::Message()
                     << "act " << static_cast<int>(act) << " m " << m << " k " << k);
        std::mt19937 rng(static_cast<uint32_t>(m * 31 + k));
        std::uniform_real_distribution<float> u(-3.0f, 3.0f);
        std::vector<uint16_t> x(m * k);
        for (auto& v : x) v = F32ToBf16(u(rng));
        if (m > 2) std::fill(x.begin() + 2 * k, x.begin() + 3 * k, 0);  // an all-zero row
        const bool block = act == ActQuant::kFp8PerTokenGroup;
        const Fp8LtScratchLayout l = Fp8LtLayout(block, m, k, 0);
        std::vector<uint8_t> bytes(RmsNormQuantScratchBytes(act, m, k), 0xff);
        Fp8LtQuantizeRef(act, x.data(), m, k, bytes.data());
        const int64_t group = block ? 128 : k;
        for (int64_t i = 0; i < l.rows; ++i) {
          std::vector<float> want(k, 0.0f);
          if (i < m) {
            for (int64_t kk = 0; kk < k; ++kk) want[kk] = Bf16ToF32(x[i * k + kk]);
          }
          QuantizeActivationRow(act, 128, k, want.data());
          for (int64_t g = 0; g * group < k; ++g) {
            const float s = ScaleAt(bytes, l, i, g);
            ASSERT_TRUE(std::isfinite(s) && s > 0) << "row " << i << " group " << g;
            if (i >= m || i == 2) {  // pad / zero rows
              EXPECT_EQ(s, 1.0f) << "row " << i;
            }
            for (int64_t kk = g * group; kk < std::min(k, (g + 1) * group); ++kk) {
              ASSERT_EQ(Fp8E4M3ToF32(bytes[l.codes + i * k + kk]) * s, want[kk])
                  << "row " << i << " column " << kk;
            }
          }
          if (!block && i >= l.tail_start) {  // the outer layout's tail copy
            float t;
            std::memcpy(&t, &bytes[l.tail_scales + 4 * (i - l.tail_start)], 4);
            EXPECT_EQ(t, ScaleAt(bytes, l, i, 0)) << "row " << i;
          }
        }
      }
    }
  }
}

// The reference is RmsNormRef's bf16 output quantized: with and without the bf16 output, the
// same codes; the bf16 output is RmsNormRef's.
TEST(RmsNormQuantRefTest, ReferenceQuantizesTheNormsBf16Output) {
  const int64_t m = 5, h = 256;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<uint16_t> x(m * h), w(h), res(m * h);
  for (auto& v : x) v = F32ToBf16(u(rng));
  for (auto& v : w) v = F32ToBf16(u(rng));
  for (auto& v : res) v = F32ToBf16(u(rng));
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    for (bool residual : {false, true}) {
      alignas(256) static uint8_t scratch_a[1 << 16], scratch_b[1 << 16];
      std::vector<uint16_t> out(m * h), want(m * h), res_a = res, res_b = res;
      RmsNormQuantArgs a{.norm = RmsNormArgs{.input = x.data(),
                                             .residual = residual ? res_a.data() : nullptr,
                                             .weight = w.data(),
                                             .out = out.data(),
                                             .num_rows = m,
                                             .hidden = h,
                                             .dtype = DType::kBF16},
                         .act_quant = act,
                         .scratch = scratch_a,
                         .scratch_bytes = sizeof(scratch_a)};
      RmsNormQuantRef(a);
      RmsNormArgs plain = a.norm;
      plain.residual = residual ? res_b.data() : nullptr;
      plain.out = want.data();
      RmsNormRef(plain);
      EXPECT_EQ(out, want);
      EXPECT_EQ(res_a, res_b);
      std::vector<uint8_t> direct(sizeof(scratch_b));
      Fp8LtQuantizeRef(act, want.data(), m, h, direct.data());
      const int64_t bytes = RmsNormQuantScratchBytes(act, m, h);
      EXPECT_EQ(std::memcmp(scratch_a, direct.data(), bytes), 0);
      // No bf16 output: the same codes and scales (and the residual updated as before).
      RmsNormQuantArgs no_out = a;
      std::vector<uint16_t> res_c = res;
      no_out.norm.out = nullptr;
      no_out.norm.residual = residual ? res_c.data() : nullptr;
      no_out.scratch = scratch_b;
      RmsNormQuantRef(no_out);
      EXPECT_EQ(std::memcmp(scratch_a, scratch_b, bytes), 0);
      EXPECT_EQ(res_c, res_b);
    }
  }
}

TEST(RmsNormQuantRefTest, CoversRefusesWhatTheFusedKernelCannotTake) {
  alignas(256) static uint8_t buf[1 << 20];
  auto args = [&] {
    return RmsNormQuantArgs{
        .norm =
            RmsNormArgs{
                .input = buf, .weight = buf, .num_rows = 17, .hidden = 4096, .dtype = DType::kBF16},
        .act_quant = ActQuant::kFp8PerTokenGroup,
        .scratch = buf,
        .scratch_bytes = sizeof(buf)};
  };
  EXPECT_TRUE(RmsNormQuantCovers(args()).ok());
  auto refused = [&](auto edit) {
    RmsNormQuantArgs a = args();
    edit(a);
    return absl::IsInvalidArgument(RmsNormQuantCovers(a));
  };
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.act_quant = ActQuant::kNone; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.act_group_size = 64; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.dtype = DType::kF32; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.hidden = 4100; }));    // % 8
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.hidden = 8200; }));    // > 8192
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.input = buf + 2; }));  // alignment
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.out = buf + 8; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.residual = buf + 4; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.norm.input_stride = 4104; }));  // strided
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.scratch = buf + 16; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) { a.scratch = nullptr; }));
  EXPECT_TRUE(refused([](RmsNormQuantArgs& a) {
    a.scratch_bytes = RmsNormQuantScratchBytes(a.act_quant, 17, 4096) - 1;
  }));
  // Per token: any hidden % 8 (not a multiple of 128); the exact scratch size is enough.
  EXPECT_FALSE(refused([](RmsNormQuantArgs& a) {
    a.act_quant = ActQuant::kFp8PerToken;
    a.norm.hidden = 1000;
    a.scratch_bytes = RmsNormQuantScratchBytes(a.act_quant, 17, 1000);
  }));
}

}  // namespace
}  // namespace tandem
