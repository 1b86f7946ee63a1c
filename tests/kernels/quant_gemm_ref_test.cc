// QuantGemmRef and the e4m3 conversions: the GEMM against GemmRef on weights dequantized here,
// independently, from the documented canonical layout (kernels/quant_gemm/quant_gemm.h), on
// awkward shapes; e4m3 against values worked out by hand from the format's definition.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

TEST(Fp8E4M3, DecodesByHand) {
  EXPECT_EQ(Fp8E4M3ToF32(0x38), 1.0f);    // exponent 7 = bias
  EXPECT_EQ(Fp8E4M3ToF32(0x7e), 448.0f);  // 1.75 * 2^8, the largest finite
  EXPECT_EQ(Fp8E4M3ToF32(0xfe), -448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), 0.001953125f);   // smallest subnormal 2^-9
  EXPECT_EQ(Fp8E4M3ToF32(0x08), 0.015625f);      // smallest normal 2^-6
  EXPECT_EQ(Fp8E4M3ToF32(0x07), 7.0f / 512.0f);  // largest subnormal
  EXPECT_EQ(Fp8E4M3ToF32(0x3b), 1.375f);
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToF32(0xff)));
  EXPECT_EQ(Fp8E4M3ToF32(0x80), 0.0f);
}

TEST(Fp8E4M3, EncodesEveryCodeBackAndRoundsHalfToEven) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(F32ToFp8E4M3(Fp8E4M3ToF32(static_cast<uint8_t>(c))), c == 0x80 ? 0x80 : c) << c;
  }
  EXPECT_EQ(F32ToFp8E4M3(1.0625f), 0x38);  // halfway 1.0 / 1.125: even mantissa 0
  EXPECT_EQ(F32ToFp8E4M3(1.1875f), 0x3a);  // halfway 1.125 / 1.25: even mantissa 2
  EXPECT_EQ(F32ToFp8E4M3(1.07f), 0x39);
  EXPECT_EQ(F32ToFp8E4M3(1.9375f), 0x40);        // halfway 1.875 / 2.0: rounds up into the exponent
  EXPECT_EQ(F32ToFp8E4M3(0.0029296875f), 0x02);  // 1.5 * 2^-9: halfway 1 / 2 subnormals -> 2
  EXPECT_EQ(F32ToFp8E4M3(0.0009765625f), 0x00);  // 2^-10: halfway 0 / 2^-9 -> 0
  EXPECT_EQ(F32ToFp8E4M3(0.0146484375f), 0x08);  // 7.5 * 2^-9 -> 8 * 2^-9, the smallest normal
  EXPECT_EQ(F32ToFp8E4M3(460.0f), 0x7e);         // saturates
  EXPECT_EQ(F32ToFp8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(F32ToFp8E4M3(NAN), 0x7f);
}

struct Case {
  QuantCode code;
  int64_t m, n, k, group;
  bool zeros, bias, accumulate;
  ActQuant act = ActQuant::kNone;
  int64_t act_group = 128;
};

// What the canonical layout says w[j, kk] is, written out here on its own.
float Expected(const Case& c, const std::vector<uint8_t>& codes, const std::vector<float>& scales,
               const std::vector<uint8_t>& zeros, int64_t j, int64_t kk) {
  const int64_t groups = (c.k + c.group - 1) / c.group, g = kk / c.group;
  const float s = scales[j * groups + g];
  if (c.code == QuantCode::kInt8) return static_cast<int8_t>(codes[j * c.k + kk]) * s;
  if (c.code == QuantCode::kFp8E4M3) return Fp8E4M3ToF32(codes[j * c.k + kk]) * s;
  const int64_t row = (c.k + 1) / 2;
  const uint8_t b = codes[j * row + kk / 2];
  const int q = kk % 2 ? b >> 4 : b & 15;
  return (q - (c.zeros ? zeros[j * groups + g] : 8)) * s;
}

void RoundRowsE4M3(const Case& c, std::vector<float>& a) {
  const int64_t group = c.act == ActQuant::kFp8PerToken ? c.k : c.act_group;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t k0 = 0; k0 < c.k; k0 += group) {
      const int64_t k1 = std::min(c.k, k0 + group);
      float amax = 0;
      for (int64_t kk = k0; kk < k1; ++kk) amax = std::max(amax, std::fabs(a[i * c.k + kk]));
      const float s = amax / 448.0f;
      for (int64_t kk = k0; kk < k1; ++kk) {
        float& x = a[i * c.k + kk];
        x = Fp8E4M3ToF32(F32ToFp8E4M3(x / s)) * s;
      }
    }
  }
}

void Check(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "code " << static_cast<int>(c.code) << " m " << c.m << " n "
                                    << c.n << " k " << c.k << " group " << c.group);
  std::mt19937 rng(static_cast<uint32_t>(c.m * 131 + c.n * 17 + c.k));
  const int64_t groups = (c.k + c.group - 1) / c.group;
  const int64_t row = c.code == QuantCode::kUint4 ? (c.k + 1) / 2 : c.k;
  std::vector<uint8_t> codes(c.n * row), zeros(c.zeros ? c.n * groups : 0);
  for (auto& b : codes) {
    b = static_cast<uint8_t>(rng() & 0xff);
    if (c.code == QuantCode::kFp8E4M3 && (b & 0x7f) == 0x7f) b = 0x3c;  // no NaN codes
  }
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % 17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.01f, 0.1f);
  std::vector<float> scales(c.n * groups), a(c.m * c.k), bias(c.n), c_quant(c.m * c.n),
      c_ref(c.m * c.n);
  for (auto& s : scales) s = pos(rng);
  for (auto& x : a) x = u(rng);
  for (auto& x : bias) x = u(rng);
  for (int64_t i = 0; i < c.m * c.n; ++i) c_quant[i] = c_ref[i] = u(rng);
  std::vector<float> dense(c.n * c.k);
  for (int64_t j = 0; j < c.n; ++j) {
    for (int64_t kk = 0; kk < c.k; ++kk)
      dense[j * c.k + kk] = Expected(c, codes, scales, zeros, j, kk);
  }
  QuantGemmArgs q{.a = a.data(),
                  .bias = c.bias ? bias.data() : nullptr,
                  .c = c_quant.data(),
                  .m = c.m,
                  .n = c.n,
                  .k = c.k,
                  .a_dtype = DType::kF32,
                  .c_dtype = DType::kF32,
                  .accumulate = c.accumulate,
                  .code = c.code,
                  .w = codes.data(),
                  .scales = scales.data(),
                  .zeros = c.zeros ? zeros.data() : nullptr,
                  .group_size = c.group,
                  .act_quant = c.act,
                  .act_group_size = c.act_group};
  QuantGemmRef(q);
  std::vector<float> a_ref = a;
  if (c.act != ActQuant::kNone) RoundRowsE4M3(c, a_ref);
  GemmRef(GemmArgs{.a = a_ref.data(),
                   .w = dense.data(),
                   .bias = c.bias ? bias.data() : nullptr,
                   .c = c_ref.data(),
                   .m = c.m,
                   .n = c.n,
                   .k = c.k,
                   .a_dtype = DType::kF32,
                   .w_dtype = DType::kF32,
                   .c_dtype = DType::kF32,
                   .accumulate = c.accumulate});
  // Same products summed in the same order: the same bits.
  for (int64_t i = 0; i < c.m * c.n; ++i) ASSERT_EQ(c_quant[i], c_ref[i]) << "element " << i;
}

TEST(QuantGemmRef, MatchesGemmRefOnIndependentlyDequantizedWeights) {
  for (QuantCode code : {QuantCode::kFp8E4M3, QuantCode::kInt8, QuantCode::kUint4}) {
    for (int64_t m : {1, 3, 19}) {
      for (auto [n, k] :
           {std::pair<int64_t, int64_t>{1, 1}, {7, 5}, {33, 19}, {40, 130}, {65, 257}}) {
        const bool int4 = code == QuantCode::kUint4;
        // Per-channel (group = k) and groups that leave a partial last one.
        for (int64_t group : {k, int64_t{int4 ? 32 : 128}, int64_t{7}}) {
          Check({code, m, n, k, group, int4 && group != 7, m == 3, m == 19});
        }
      }
    }
  }
}

TEST(QuantGemmRef, QuantizesActivationsToE4M3PerTokenAndPerGroup) {
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    Check({QuantCode::kFp8E4M3, 5, 33, 300, 128, false, true, false, act, 128});
    Check({QuantCode::kFp8E4M3, 1, 8, 19, 19, false, false, true, act, 7});
  }
}

TEST(QuantGemmRef, ActivationQuantizationChangesTheResult) {
  // A row whose values are not all e4m3 numbers at its scale: per-token quantization must move
  // at least one output (else the check above would pass with quantization switched off).
  Case c{QuantCode::kInt8, 2, 9, 64, 64, false, false, false, ActQuant::kFp8PerToken};
  std::vector<uint8_t> codes(c.n * c.k, 3);
  std::vector<float> scales(c.n, 0.5f), a(c.m * c.k), out_q(c.m * c.n), out_none(c.m * c.n);
  for (int64_t i = 0; i < c.m * c.k; ++i) a[i] = 0.1f + 0.0137f * static_cast<float>(i % 29);
  QuantGemmArgs q{.a = a.data(),
                  .c = out_q.data(),
                  .m = c.m,
                  .n = c.n,
                  .k = c.k,
                  .code = c.code,
                  .w = codes.data(),
                  .scales = scales.data(),
                  .group_size = c.k,
                  .act_quant = ActQuant::kFp8PerToken};
  QuantGemmRef(q);
  q.c = out_none.data();
  q.act_quant = ActQuant::kNone;
  QuantGemmRef(q);
  EXPECT_NE(out_q[0], out_none[0]);
  EXPECT_NEAR(out_q[0], out_none[0], 0.05f * std::fabs(out_none[0]));
}

TEST(QuantGemmRef, Bf16OutputRoundsOnce) {
  Case c{QuantCode::kInt8, 2, 5, 9, 9, false, true, false};
  std::vector<uint8_t> codes(c.n * c.k);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37);
  std::vector<float> scales(c.n, 0.03f), a(c.m * c.k, 0.7f), out32(c.m * c.n);
  std::vector<uint16_t> bias(c.n, F32ToBf16(0.25f)), out16(c.m * c.n);
  std::vector<float> bias32(c.n, 0.25f);
  QuantGemmArgs q{.a = a.data(),
                  .bias = bias32.data(),
                  .c = out32.data(),
                  .m = c.m,
                  .n = c.n,
                  .k = c.k,
                  .code = c.code,
                  .w = codes.data(),
                  .scales = scales.data(),
                  .group_size = c.k};
  QuantGemmRef(q);
  q.bias = bias.data();
  q.c = out16.data();
  q.c_dtype = DType::kBF16;
  QuantGemmRef(q);
  for (int64_t i = 0; i < c.m * c.n; ++i) EXPECT_EQ(out16[i], F32ToBf16(out32[i])) << i;
}

}  // namespace
}  // namespace tandem
