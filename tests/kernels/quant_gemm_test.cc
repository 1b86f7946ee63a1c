// QuantGemmSkinny (CUDA) against QuantGemmRef: W8A16 and W4A16 on awkward shapes (odd n, m from
// 1 to 32, partial last groups, per-channel and grouped scales, with and without zero points,
// bias, accumulate, bf16 and f32 a / c); outputs start as NaN so a missed write fails. Skips
// without a device. Refusals (FP8, activation quantization, m > 32, k % 32) need no device.
#include "kernels/quant_gemm/quant_gemm.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

struct Shape {
  QuantCode code;
  int64_t m, n, k, group;
  bool zeros, bias, accumulate, bf16;
};

void Check(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "code " << static_cast<int>(s.code) << " m " << s.m << " n " << s.n << " k "
               << s.k << " group " << s.group << " bf16 " << s.bf16);
  std::mt19937 rng(static_cast<uint32_t>(s.m * 7 + s.n * 131 + s.k));
  const int64_t groups = QuantNumGroups(s.k, s.group);
  std::vector<uint8_t> codes(s.n * QuantRowBytes(s.code, s.k)), zeros(s.zeros ? s.n * groups : 0);
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % 17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.005f, 0.05f);
  std::vector<float> scales(s.n * groups), a(s.m * s.k), bias(s.n), c0(s.m * s.n);
  for (auto& x : scales) x = pos(rng);
  for (auto& x : a) x = u(rng);
  for (auto& x : bias) x = u(rng);
  for (auto& x : c0) x = u(rng);
  const DType t = s.bf16 ? DType::kBF16 : DType::kF32;
  // Inputs in the dtype under test; the reference reads the same (rounded) values.
  auto encode = [&](const std::vector<float>& v) {
    std::vector<uint8_t> out(v.size() * DTypeSize(t));
    for (size_t i = 0; i < v.size(); ++i) {
      if (s.bf16) {
        const uint16_t b = F32ToBf16(v[i]);
        std::memcpy(&out[2 * i], &b, 2);
      } else {
        std::memcpy(&out[4 * i], &v[i], 4);
      }
    }
    return out;
  };
  const std::vector<uint8_t> a_h = encode(a), bias_h = encode(bias), c0_h = encode(c0);
  std::vector<uint8_t> want = c0_h;
  QuantGemmArgs args{.a = a_h.data(),
                     .bias = s.bias ? bias_h.data() : nullptr,
                     .c = want.data(),
                     .m = s.m,
                     .n = s.n,
                     .k = s.k,
                     .a_dtype = t,
                     .c_dtype = t,
                     .accumulate = s.accumulate,
                     .code = s.code,
                     .w = codes.data(),
                     .scales = scales.data(),
                     .zeros = s.zeros ? zeros.data() : nullptr,
                     .group_size = s.group};
  QuantGemmRef(args);

  DeviceBuffer da(a_h), dbias(bias_h), dw(codes), dscales(scales),
      dzeros(std::max<size_t>(zeros.size(), 1)), dc(c0_h.size());
  if (!zeros.empty()) dzeros.Upload(zeros.data());
  if (s.accumulate) {
    dc.Upload(c0_h.data());
  } else {
    dc.Poison();
  }
  QuantGemmArgs d = args;
  d.a = da.get();
  d.bias = s.bias ? dbias.get() : nullptr;
  d.c = dc.get();
  d.w = dw.as<uint8_t>();
  d.scales = dscales.as<float>();
  d.zeros = s.zeros ? dzeros.as<uint8_t>() : nullptr;
  ASSERT_TRUE(QuantGemmSkinny(d, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> got(c0_h.size());
  dc.Download(got.data());
  for (int64_t i = 0; i < s.m * s.n; ++i) {
    float g, w;
    if (s.bf16) {
      uint16_t gb, wb;
      std::memcpy(&gb, &got[2 * i], 2);
      std::memcpy(&wb, &want[2 * i], 2);
      g = Bf16ToF32(gb);
      w = Bf16ToF32(wb);
    } else {
      std::memcpy(&g, &got[4 * i], 4);
      std::memcpy(&w, &want[4 * i], 4);
    }
    // fp32 sums of k products in another order; bf16 outputs may round to a neighbour.
    const float tol =
        1e-4f * std::sqrt(static_cast<float>(s.k)) + (s.bf16 ? 8e-3f * std::fabs(w) : 0);
    ASSERT_TRUE(std::isfinite(g)) << "element " << i;
    ASSERT_NEAR(g, w, tol + 1e-5f) << "element " << i;
  }
}

TEST(QuantGemmSkinnyTest, MatchesReferenceOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4}) {
    for (int64_t m : {1, 2, 7, 19, 32}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32}, {7, 96}, {33, 224}, {129, 4096}}) {
        const bool int4 = code == QuantCode::kUint4;
        for (int64_t group : {k, int64_t{int4 ? 64 : 128}}) {
          for (bool bf16 : {false, true}) {
            Check({code, m, n, k, group, int4 && group != k, m % 2 == 1, m == 7, bf16});
          }
        }
      }
    }
  }
}

TEST(QuantGemmSkinnyTest, RefusesWhatItDoesNotCover) {
  alignas(16) static uint8_t w[64 * 64];
  float scales[64] = {};
  QuantGemmArgs ok{.m = 1,
                   .n = 1,
                   .k = 64,
                   .code = QuantCode::kInt8,
                   .w = w,
                   .scales = scales,
                   .group_size = 64};
  auto refused = [](QuantGemmArgs a) {
    return QuantGemmSkinny(a, nullptr).code() == absl::StatusCode::kInvalidArgument;
  };
  QuantGemmArgs a = ok;
  a.code = QuantCode::kFp8E4M3;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.act_quant = ActQuant::kFp8PerToken;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.m = kQuantSkinnyMaxM + 1;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.k = 40;
  a.group_size = 40;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.group_size = 48;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.w = w + 1;
  EXPECT_TRUE(refused(a));
}

}  // namespace
}  // namespace tandem
