// QuantGemmSkinny (CUDA) against QuantGemmRef: INT8, UINT4 and FP8 e4m3 weights on awkward
// shapes (odd n, every m from 1 to kQuantSkinnyMaxM's tiles, every row tile of the dispatch,
// per-channel and grouped scales, with and without zero points, bias, accumulate, bf16 and f32
// a / c, plain and PDL launches); outputs start as NaN so a missed write fails. QuantDequantize
// against QuantDequantizeRow and QuantizeActivations against QuantizeActivationRow, bit for bit
// (odd k, partial groups, zero rows, in place). Skips without a device. Refusals (activation
// quantization, m > kQuantSkinnyMaxM, k % 32, misalignment) need no device.
#include "kernels/quant_gemm/quant_gemm.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

// A random code byte; FP8's NaN codes (S.1111.111) are avoided (the checkpoints' quantizers
// never write them; a NaN weight would make the comparison meaningless).
uint8_t RandomCode(QuantCode code, std::mt19937& rng) {
  uint8_t b = static_cast<uint8_t>(rng());
  if (code == QuantCode::kFp8E4M3 && (b & 0x7f) == 0x7f) b ^= 0x01;
  return b;
}

struct Shape {
  QuantCode code;
  int64_t m, n, k, group;
  bool zeros, bias, accumulate, bf16;
  bool pdl = false;
};

void Check(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "code " << static_cast<int>(s.code) << " m " << s.m << " n " << s.n << " k "
               << s.k << " group " << s.group << " bf16 " << s.bf16);
  std::mt19937 rng(static_cast<uint32_t>(s.m * 7 + s.n * 131 + s.k));
  const int64_t groups = QuantNumGroups(s.k, s.group);
  std::vector<uint8_t> codes(s.n * QuantRowBytes(s.code, s.k)), zeros(s.zeros ? s.n * groups : 0);
  for (auto& b : codes) b = RandomCode(s.code, rng);
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % 17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.005f, 0.05f);
  std::vector<float> scales(s.n * groups), a(s.m * s.k), bias(s.n), c0(s.m * s.n);
  // e4m3 codes reach +-448 (int8 127): smaller scales keep the products, and so the fp32
  // rounding the tolerance below allows for, of the same size.
  for (auto& x : scales) x = pos(rng) * (s.code == QuantCode::kFp8E4M3 ? 0.25f : 1.0f);
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
  d.overlap_launch = s.pdl;
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
  // The row tiles of the dispatch (quant_gemm.cu): n >= 2112 with rows of at most 128 vectors
  // takes the two-group 8-row tile (n = 2117: the last block's second group partly past n),
  // n >= 1056 with at most 256 vectors the 4-row tile, with at most 512 the 4-row tile of two
  // vectors a thread (385 uint4 / 386 int8 vectors: a partial second vector), n >= 528 with
  // longer rows the 2-row tile (k = 8224: 257 uint4 vectors, 514 int8 ones, a partial last
  // pass), the rest the 1-row tile; m = 1, 2 and 4 are the kernel's instantiations, 3 a partial
  // one.
  for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4, QuantCode::kFp8E4M3}) {
    const bool int4 = code == QuantCode::kUint4;
    for (int64_t m : {1, 2, 3, 4}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 32},
                          {7, 96},
                          {33, 224},
                          {129, 4096},
                          {2117, int64_t{int4 ? 4096 : 2048}},
                          {1061, int64_t{int4 ? 8192 : 4096}},
                          {1061, int64_t{int4 ? 12320 : 6176}},
                          {531, 8224}}) {
        for (int64_t group : {k, int64_t{int4 ? 64 : 128}}) {
          for (bool bf16 : {false, true}) {
            Check({code, m, n, k, group, int4 && group != k, m % 2 == 1, m == 3, bf16,
                   /*pdl=*/(m + n) % 2 == 0});
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
  EXPECT_TRUE(QuantGemmSkinnyCovers(ok).ok());
  QuantGemmArgs a = ok;
  a.code = QuantCode::kFp8E4M3;
  EXPECT_TRUE(QuantGemmSkinnyCovers(a).ok());
  a.zeros = w;  // zero points are for uint4 only
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
  EXPECT_FALSE(QuantGemmSkinnyCovers(a).ok());
  a = ok;
  a.a = w + 8;  // activations are read 16 bytes at a time
  EXPECT_TRUE(refused(a));
}

std::vector<float> FromDevice(const std::vector<uint8_t>& bytes, bool bf16) {
  std::vector<float> out(bytes.size() / (bf16 ? 2 : 4));
  for (size_t i = 0; i < out.size(); ++i) {
    if (bf16) {
      uint16_t b;
      std::memcpy(&b, &bytes[2 * i], 2);
      out[i] = Bf16ToF32(b);
    } else {
      std::memcpy(&out[i], &bytes[4 * i], 4);
    }
  }
  return out;
}

std::vector<uint8_t> ToDevice(const std::vector<float>& v, bool bf16) {
  std::vector<uint8_t> out(v.size() * (bf16 ? 2 : 4));
  for (size_t i = 0; i < v.size(); ++i) {
    if (bf16) {
      const uint16_t b = F32ToBf16(v[i]);
      std::memcpy(&out[2 * i], &b, 2);
    } else {
      std::memcpy(&out[4 * i], &v[i], 4);
    }
  }
  return out;
}

// The same bits, but for the sign of a zero (an e4m3 underflow's sign is of no consequence).
bool SameBits(float a, float b) { return std::memcmp(&a, &b, 4) == 0 || (a == 0 && b == 0); }

TEST(QuantDequantizeTest, MatchesReferenceBitForBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  struct Case {
    int64_t n, k, group;
  };
  for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4, QuantCode::kFp8E4M3}) {
    for (const Case& c :
         {Case{1, 1, 1}, Case{5, 37, 16}, Case{7, 200, 128}, Case{33, 224, 224}, Case{3, 4096, 128},
          Case{2, 131, 131}, Case{5, 8224, 64}, Case{4, 96, 32}, Case{3, 64, 256}}) {
      for (bool zeros : {false, true}) {
        if (zeros && code != QuantCode::kUint4) continue;
        for (bool bf16 : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << "code " << static_cast<int>(code) << " n " << c.n << " k " << c.k
                       << " group " << c.group << " zeros " << zeros << " bf16 " << bf16);
          std::mt19937 rng(static_cast<uint32_t>(c.n * 31 + c.k));
          const int64_t groups = QuantNumGroups(c.k, c.group);
          std::vector<uint8_t> codes(c.n * QuantRowBytes(code, c.k)), zp(zeros ? c.n * groups : 0);
          for (auto& b : codes) b = RandomCode(code, rng);
          for (auto& z : zp) z = static_cast<uint8_t>(rng() % 17);
          std::uniform_real_distribution<float> pos(1e-4f, 0.5f);
          std::vector<float> scales(c.n * groups);
          for (auto& x : scales) x = pos(rng);
          QuantGemmArgs args{.n = c.n,
                             .k = c.k,
                             .code = code,
                             .w = codes.data(),
                             .scales = scales.data(),
                             .zeros = zeros ? zp.data() : nullptr,
                             .group_size = c.group};
          std::vector<float> want(c.n * c.k);
          for (int64_t j = 0; j < c.n; ++j) QuantDequantizeRow(args, j, want.data() + j * c.k);

          DeviceBuffer dw(codes), ds(scales), dz(std::max<size_t>(zp.size(), 1)),
              out(want.size() * (bf16 ? 2 : 4));
          if (zeros) dz.Upload(zp.data());
          out.Poison();
          QuantGemmArgs d = args;
          d.w = dw.as<uint8_t>();
          d.scales = ds.as<float>();
          d.zeros = zeros ? dz.as<uint8_t>() : nullptr;
          ASSERT_TRUE(
              QuantDequantize(d, out.get(), bf16 ? DType::kBF16 : DType::kF32, nullptr).ok());
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<uint8_t> bytes(want.size() * (bf16 ? 2 : 4));
          out.Download(bytes.data());
          const std::vector<float> got = FromDevice(bytes, bf16);
          for (size_t i = 0; i < want.size(); ++i) {
            const float w = bf16 ? RoundToBf16(want[i]) : want[i];
            ASSERT_TRUE(SameBits(got[i], w)) << "element " << i << ": " << got[i] << " vs " << w;
          }
        }
      }
    }
  }
  QuantGemmArgs bad{.n = 1, .k = 4, .code = QuantCode::kInt8, .group_size = 0};
  EXPECT_EQ(QuantDequantize(bad, nullptr, DType::kBF16, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QuantizeActivationsTest, MatchesReferenceBitForBit) {
  TANDEM_SKIP_WITHOUT_GPU();
  struct Case {
    ActQuant quant;
    int64_t group, m, k;
  };
  const Case cases[] = {{ActQuant::kFp8PerToken, 128, 1, 1},
                        {ActQuant::kFp8PerToken, 128, 5, 37},
                        {ActQuant::kFp8PerToken, 128, 33, 4096},
                        {ActQuant::kFp8PerTokenGroup, 128, 3, 200},
                        {ActQuant::kFp8PerTokenGroup, 128, 17, 1024},
                        {ActQuant::kFp8PerTokenGroup, 48, 4, 100},
                        {ActQuant::kNone, 128, 3, 40}};
  for (const Case& c : cases) {
    for (bool bf16 : {false, true}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "quant " << static_cast<int>(c.quant) << " group " << c.group << " m "
                     << c.m << " k " << c.k << " bf16 " << bf16 << " in place " << in_place);
        std::mt19937 rng(static_cast<uint32_t>(c.m * 7 + c.k));
        // Rows of different magnitudes (tiny ones reach e4m3's subnormals relative to the
        // group's max), and row 1 all zero (copied as it is).
        std::vector<float> x(c.m * c.k);
        for (int64_t i = 0; i < c.m; ++i) {
          std::uniform_real_distribution<float> u(-1.0f, 1.0f);
          const float mag = std::ldexp(1.0f, static_cast<int>(i % 9) - 4);
          for (int64_t kk = 0; kk < c.k; ++kk) {
            float v = u(rng) * mag;
            if (kk % 11 == 3) v *= 1e-3f;
            x[i * c.k + kk] = i == 1 ? 0.0f : v;
          }
        }
        if (bf16) {
          for (float& v : x) v = RoundToBf16(v);
        }
        std::vector<float> want = x;
        for (int64_t i = 0; i < c.m; ++i) {
          QuantizeActivationRow(c.quant, c.group, c.k, want.data() + i * c.k);
        }
        DeviceBuffer dx(ToDevice(x, bf16)), dout(x.size() * (bf16 ? 2 : 4));
        dout.Poison();
        void* out = in_place ? dx.get() : dout.get();
        ASSERT_TRUE(QuantizeActivations(c.quant, c.group, dx.get(), out, c.m, c.k,
                                        bf16 ? DType::kBF16 : DType::kF32, nullptr)
                        .ok());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<uint8_t> bytes(x.size() * (bf16 ? 2 : 4));
        (in_place ? dx : dout).Download(bytes.data());
        const std::vector<float> got = FromDevice(bytes, bf16);
        int64_t changed = 0;
        for (size_t i = 0; i < want.size(); ++i) {
          const float w = bf16 ? RoundToBf16(want[i]) : want[i];
          ASSERT_TRUE(SameBits(got[i], w)) << "element " << i << ": " << got[i] << " vs " << w;
          changed += got[i] != x[i];
        }
        // The rounding did something (the test would pass on a plain copy otherwise).
        if (c.quant != ActQuant::kNone && c.k > 1) {
          EXPECT_GT(changed, 0);
        }
      }
    }
  }
  EXPECT_EQ(QuantizeActivations(ActQuant::kFp8PerTokenGroup, 0, nullptr, nullptr, 1, 8,
                                DType::kBF16, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
