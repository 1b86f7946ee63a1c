// Fp8GemmLt (cuBLASLt FP8 W8A8, kernels/quant_gemm/fp8_gemm_lt.h) against QuantGemmRef with
// dynamic FP8 activations: both scale layouts (per-channel weights + per-token activations;
// 128x128 block weights + per-token-group(128) activations) and the block layout's per-row
// fallback (weight scales that differ inside a 128-row block), on m = 1, 3, 33, 100, 257, 1000
// (m % 4 != 0 takes the block modes' tail GEMM), n and k multiples of 16 with partial 128-row
// and 128-column blocks, bias, accumulate, bf16 and f32 activations; outputs start as NaN so a
// missed write fails. The activation quantizer's codes and scales against the reference's
// rounding bit for bit. Refusals and the weight-scale packing need no device.
//
// Tolerance, per element: |got - want| <= 2^-7 |want| + 2^-10 S + 1e-6, with
// S = sum_kk |qa(i, kk)| |qw(j, kk)| (the dequantized magnitudes, QuantGemmRef on |a| and |w|).
// Both sides multiply the same e4m3 values at the same scales (the quantizer is bit-exact), so
// they differ by summation order and by the FP8 tensor cores' accumulation, which keeps fewer
// than fp32's bits inside each 128-column block before cuBLASLt promotes the partial sum to fp32
// (about 2^-13 of the block's magnitude; 2^-10 S leaves 8x room), plus one bf16 rounding step of
// the output (2^-7 relative: two nearby fp32 sums may round to neighbouring bf16 values). A
// wrong scale, row, group or tail row is off by a sizeable fraction of |want| ~ S / sqrt(k),
// well above 2^-10 S at these k.
#include "kernels/quant_gemm/fp8_gemm_lt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/fp8_gemm_lt_check.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

uint8_t RandomFp8(std::mt19937& rng) {
  uint8_t b = static_cast<uint8_t>(rng());
  if ((b & 0x7f) == 0x7f) b ^= 0x01;  // no NaN codes (the checkpoints' quantizers write none)
  return b;
}

std::vector<uint8_t> Encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kBF16) {
      const uint16_t b = F32ToBf16(v[i]);
      std::memcpy(&out[2 * i], &b, 2);
    } else {
      std::memcpy(&out[4 * i], &v[i], 4);
    }
  }
  return out;
}

std::vector<float> DecodeBf16(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t b;
    std::memcpy(&b, &bytes[2 * i], 2);
    out[i] = Bf16ToF32(b);
  }
  return out;
}

// Activations with rows of different magnitude, outliers (so groups get different scales), an
// all-zero row and an all-zero 128-column group.
std::vector<float> Activations(int64_t m, int64_t k, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> a(m * k);
  for (int64_t i = 0; i < m; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>(i % 5) - 2);
    for (int64_t kk = 0; kk < k; ++kk) a[i * k + kk] = u(rng) * mag;
    a[i * k + (i * 37) % k] *= 8.0f;
  }
  if (m > 5) std::fill(a.begin() + 5 * k, a.begin() + 6 * k, 0.0f);
  if (m > 2) std::fill(a.begin() + 2 * k, a.begin() + 2 * k + std::min<int64_t>(k, 128), 0.0f);
  return a;
}

struct Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t group = 0;
  ActQuant act = ActQuant::kFp8PerToken;
};

Weight MakeWeight(Layout layout, int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_real_distribution<float> pos(0.005f, 0.05f);
  Weight w;
  w.codes.resize(n * k);
  for (auto& b : w.codes) b = RandomFp8(rng);
  const bool channel = layout == Layout::kChannel || layout == Layout::kChannelRows;
  w.group = channel ? k : 128;
  w.act = layout == Layout::kChannel ? ActQuant::kFp8PerToken : ActQuant::kFp8PerTokenGroup;
  const int64_t groups = QuantNumGroups(k, w.group);
  w.scales.resize(n * groups);
  for (auto& s : w.scales) s = pos(rng) * 0.25f;
  if (layout == Layout::kBlock) {  // the block's scale on each of its rows
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t g = 0; g < groups; ++g)
        w.scales[j * groups + g] = w.scales[j / 128 * 128 * groups + g];
    }
  }
  return w;
}

// Fp8GemmLt on `stream`, captured into a graph and launched when `capture` (the plan is then
// made under capture: the tuner's fallback). With `failed` (eager only), a call that returns an
// error stores it there instead of failing the test.
void RunGemm(const QuantGemmArgs& d, const Fp8LtWeight& lt, const DeviceBuffer& scratch,
             int64_t scratch_bytes, cudaStream_t stream, bool capture,
             absl::Status* failed = nullptr) {
  if (!capture) {
    const absl::Status st = Fp8GemmLt(d, lt, scratch.get(), scratch_bytes, stream);
    if (failed != nullptr && !st.ok()) {
      *failed = st;
      cudaGetLastError();
      return;
    }
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return;
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status st = Fp8GemmLt(d, lt, scratch.get(), scratch_bytes, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace

void CheckFp8LtRuns(const Fp8LtCase& c, const std::function<bool(int)>& before_run,
                    cudaStream_t stream, bool capture, int* failed_calls) {
  SCOPED_TRACE(::testing::Message() << "layout " << static_cast<int>(c.layout) << " m " << c.m
                                    << " n " << c.n << " k " << c.k << " bias " << c.bias
                                    << " accumulate " << c.accumulate << " a f32 " << c.a_f32);
  std::mt19937 rng(
      static_cast<uint32_t>(c.m * 7 + c.n * 131 + c.k * 3 + static_cast<int>(c.layout)));
  const Weight w = MakeWeight(c.layout, c.n, c.k, rng);
  const std::vector<float> a = Activations(c.m, c.k, rng);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> bias(c.n), c0(c.m * c.n);
  for (auto& x : bias) x = u(rng);
  for (auto& x : c0) x = u(rng);
  const DType a_dtype = c.a_f32 ? DType::kF32 : DType::kBF16;
  const std::vector<uint8_t> a_h = Encode(a, a_dtype), bias_h = Encode(bias, DType::kBF16),
                             c0_h = Encode(c0, DType::kBF16);
  QuantGemmArgs args{.a = a_h.data(),
                     .bias = c.bias ? bias_h.data() : nullptr,
                     .m = c.m,
                     .n = c.n,
                     .k = c.k,
                     .a_dtype = a_dtype,
                     .c_dtype = DType::kBF16,
                     .accumulate = c.accumulate,
                     .code = QuantCode::kFp8E4M3,
                     .w = w.codes.data(),
                     .scales = w.scales.data(),
                     .group_size = w.group,
                     .act_quant = w.act,
                     .act_group_size = 128};
  std::vector<uint8_t> want_h = c0_h;
  args.c = want_h.data();
  QuantGemmRef(args);
  const std::vector<float> want = DecodeBf16(want_h);
  // S: the same product on magnitudes (e4m3 is sign-magnitude; |a| rounds to |q(a)|).
  std::vector<float> a_abs(a.size()), s(c.m * c.n);
  for (size_t i = 0; i < a.size(); ++i) a_abs[i] = std::fabs(RoundToBf16(a[i]));
  std::vector<uint8_t> codes_abs = w.codes;
  for (auto& b : codes_abs) b &= 0x7f;
  QuantGemmArgs mag = args;
  mag.a = a_abs.data();
  mag.a_dtype = DType::kF32;
  mag.bias = nullptr;
  mag.accumulate = false;
  mag.c = s.data();
  mag.c_dtype = DType::kF32;
  mag.w = codes_abs.data();
  QuantGemmRef(mag);

  absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(args);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const Fp8LtWeightScales expect_mode =
      c.layout == Layout::kChannel ? Fp8LtWeightScales::kPerChannel
      : c.layout == Layout::kBlock ? Fp8LtWeightScales::kBlock128x128
                                   : Fp8LtWeightScales::kRow128;
  ASSERT_EQ(packed->mode, expect_mode);
  DeviceBuffer da(a_h), dbias(bias_h), dw(w.codes), dscales(packed->scales), dc(c0_h.size());
  const int64_t scratch_bytes = Fp8LtScratchBytes(c.m, c.k, c.n);
  DeviceBuffer scratch(scratch_bytes);
  QuantGemmArgs d = args;
  d.a = da.get();
  d.bias = c.bias ? dbias.get() : nullptr;
  d.c = dc.get();
  d.w = dw.as<uint8_t>();
  d.scales = nullptr;  // Fp8GemmLt reads the packed scales
  const Fp8LtWeight lt{.w = dw.as<uint8_t>(),
                       .scales = dscales.as<float>(),
                       .n = c.n,
                       .k = c.k,
                       .mode = packed->mode};
  for (int run = 0; before_run(run); ++run) {
    SCOPED_TRACE(::testing::Message() << "run " << run);
    scratch.Poison();  // pad rows and scales must be written, not found
    if (c.accumulate) {
      dc.Upload(c0_h.data());
    } else {
      dc.Poison();
    }
    absl::Status failed;
    ASSERT_NO_FATAL_FAILURE(RunGemm(d, lt, scratch, scratch_bytes, stream, capture,
                                    failed_calls != nullptr ? &failed : nullptr));
    if (!failed.ok()) {
      ++*failed_calls;
      std::cout << "run " << run << ": the call failed (" << failed << "), not checked\n";
      continue;
    }
    std::vector<uint8_t> got_h(c0_h.size());
    dc.Download(got_h.data());
    const std::vector<float> got = DecodeBf16(got_h);
    double worst = 0;
    for (int64_t i = 0; i < c.m * c.n; ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "element " << i << " (row " << i / c.n << ")";
      const double tol = std::ldexp(std::fabs(want[i]), -7) + std::ldexp(s[i], -10) + 1e-6;
      ASSERT_NEAR(got[i], want[i], tol)
          << "element " << i << " (row " << i / c.n << "), S " << s[i];
      worst = std::max(worst, std::fabs(got[i] - want[i]) / tol);
    }
    std::cout << "fp8 cublaslt layout " << static_cast<int>(c.layout) << " m " << c.m << " n "
              << c.n << " k " << c.k << (run > 0 ? " run " + std::to_string(run) : "")
              << ": worst error " << worst << " of the tolerance\n";
  }
}

void CheckFp8Lt(const Fp8LtCase& c, cudaStream_t stream, bool capture) {
  CheckFp8LtRuns(
      c, [](int run) { return run == 0; }, stream, capture);
}

namespace {

TEST(Fp8GemmLtTest, MatchesReferenceOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (Layout layout :
       {Layout::kChannel, Layout::kBlock, Layout::kBlockRows, Layout::kChannelRows}) {
    for (int64_t m : {1, 3, 33, 100, 257, 1000}) {
      // 272 = 2 x 128 + 16 and 528 = 4 x 128 + 16: partial last blocks along k (L4 padding at
      // L = 3); n = 400: a partial 128-row block.
      for (auto [n, k] : {std::pair<int64_t, int64_t>{144, 272}, {400, 528}, {256, 1024}}) {
        const bool bias = m % 2 == 1 && m != 257;
        CheckFp8Lt({layout, m, n, k, bias, m == 100 || m == 257, m == 33 && n == 144});
      }
    }
  }
}

// The quantizer's codes and scales are the reference's rounding (QuantizeActivationRow), bit for
// bit, pad rows are zero codes with scale 1, and the tail rows' scales are where the tail GEMM
// reads them.
TEST(Fp8GemmLtTest, ActivationCodesAreTheReferenceRounding) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    for (int64_t m : {1, 6, 37}) {
      const int64_t k = 400, n = 32;
      SCOPED_TRACE(::testing::Message() << "act " << static_cast<int>(act) << " m " << m);
      std::mt19937 rng(static_cast<uint32_t>(m));
      const std::vector<float> a = Activations(m, k, rng);
      const std::vector<uint8_t> a_h = Encode(a, DType::kBF16);
      const bool block = act == ActQuant::kFp8PerTokenGroup;
      const Fp8LtScratchLayout l = Fp8LtLayout(block, m, k, n);
      DeviceBuffer da(a_h), scratch(Fp8LtScratchBytes(m, k, n));
      scratch.Poison();
      const QuantGemmArgs args{.a = da.get(),
                               .m = m,
                               .n = n,
                               .k = k,
                               .a_dtype = DType::kBF16,
                               .c_dtype = DType::kBF16,
                               .code = QuantCode::kFp8E4M3,
                               .group_size = block ? 128 : k,
                               .act_quant = act,
                               .act_group_size = 128};
      ASSERT_TRUE(
          Fp8LtQuantizeActivations(args, scratch.get(), Fp8LtScratchBytes(m, k, n), nullptr).ok());
      std::vector<uint8_t> bytes(Fp8LtScratchBytes(m, k, n));
      scratch.Download(bytes.data());
      const int64_t group = block ? 128 : k;
      auto scale_at = [&](int64_t i, int64_t g) {
        float s;
        int64_t off;
        if (!block) {
          off = l.scales + 4 * i;
        } else if (i < l.main_rows) {
          off = l.scales + 4 * (g * l.main_rows + i);
        } else {
          off = l.tail_scales + 4 * (g * kFp8LtTailRows + (i - l.main_rows));
        }
        std::memcpy(&s, &bytes[off], 4);
        return s;
      };
      for (int64_t i = 0; i < l.rows; ++i) {
        std::vector<float> row(k, 0.0f);
        if (i < m) {
          for (int64_t kk = 0; kk < k; ++kk) row[kk] = RoundToBf16(a[i * k + kk]);
        }
        std::vector<float> want = row;
        QuantizeActivationRow(act, 128, k, want.data());
        if (!block && i >= l.tail_start) {  // the outer layout's copy for a refused m % 4
          float t;
          std::memcpy(&t, &bytes[l.tail_scales + 4 * (i - l.tail_start)], 4);
          ASSERT_EQ(t, scale_at(i, 0)) << "row " << i;
        }
        for (int64_t g = 0; g * group < k; ++g) {
          const float s = scale_at(i, g);
          ASSERT_TRUE(std::isfinite(s) && s > 0) << "row " << i << " group " << g;
          for (int64_t kk = g * group; kk < std::min(k, (g + 1) * group); ++kk) {
            const float got = Fp8E4M3ToF32(bytes[l.codes + i * k + kk]) * s;
            ASSERT_EQ(got, want[kk]) << "row " << i << " column " << kk;
          }
        }
      }
    }
  }
}

QuantGemmArgs Covered() {
  static uint8_t w[16];
  static float s[16];
  return QuantGemmArgs{.m = 64,
                       .n = 256,
                       .k = 512,
                       .a_dtype = DType::kBF16,
                       .c_dtype = DType::kBF16,
                       .code = QuantCode::kFp8E4M3,
                       .w = w,
                       .scales = s,
                       .group_size = 512,
                       .act_quant = ActQuant::kFp8PerToken};
}

TEST(Fp8GemmLtTest, RefusesWhatItDoesNotCover) {
  EXPECT_TRUE(Fp8LtCovers(Covered()).ok());
  auto refused = [](auto edit) {
    QuantGemmArgs a = Covered();
    edit(a);
    return Fp8LtCovers(a);
  };
  EXPECT_TRUE(absl::IsInvalidArgument(refused([](QuantGemmArgs& a) { a.k = 200; })));  // k % 16
  EXPECT_TRUE(absl::IsInvalidArgument(refused([](QuantGemmArgs& a) { a.n = 100; })));  // n % 16
  EXPECT_TRUE(
      absl::IsInvalidArgument(refused([](QuantGemmArgs& a) { a.code = QuantCode::kInt8; })));
  EXPECT_TRUE(
      absl::IsInvalidArgument(refused([](QuantGemmArgs& a) { a.act_quant = ActQuant::kNone; })));
  EXPECT_TRUE(absl::IsInvalidArgument(refused([](QuantGemmArgs& a) { a.c_dtype = DType::kF32; })));
  static uint16_t bias[256];
  EXPECT_TRUE(absl::IsInvalidArgument(refused([](QuantGemmArgs& a) {
    a.bias = bias;
    a.accumulate = true;
  })));
  // Scale layouts it does not map.
  EXPECT_TRUE(absl::IsUnimplemented(refused([](QuantGemmArgs& a) { a.group_size = 128; })));
  EXPECT_TRUE(absl::IsUnimplemented(refused([](QuantGemmArgs& a) {
    a.act_quant = ActQuant::kFp8PerTokenGroup;
    a.act_group_size = 64;
  })));
  EXPECT_TRUE(absl::IsUnimplemented(refused([](QuantGemmArgs& a) {
    a.act_quant = ActQuant::kFp8PerTokenGroup;
    a.group_size = 192;
  })));
  // A call that cannot run is refused before it reaches the device: misaligned pointers, a
  // scratch too small, weight scales packed for the other activations.
  alignas(256) static uint8_t buf[1 << 16];
  QuantGemmArgs call = Covered();
  call.m = 8;
  call.a = buf + 1;
  call.c = buf;
  Fp8LtWeight w{.w = buf, .scales = reinterpret_cast<const float*>(buf), .n = 256, .k = 512};
  const int64_t need = Fp8LtLayout(/*block=*/false, 8, 512, 256).bytes;
  ASSERT_LE(Fp8LtScratchBytes(8, 512, 256), int64_t{sizeof(buf)});
  EXPECT_TRUE(absl::IsInvalidArgument(Fp8GemmLt(call, w, buf, need, nullptr)));
  call.a = buf;
  EXPECT_TRUE(absl::IsInvalidArgument(Fp8GemmLt(call, w, buf, need - 1, nullptr)));
  EXPECT_TRUE(absl::IsInvalidArgument(Fp8GemmLt(call, w, buf + 16, need, nullptr)));
  w.mode = Fp8LtWeightScales::kRow128;
  EXPECT_TRUE(absl::IsInvalidArgument(Fp8GemmLt(call, w, buf, need, nullptr)));
  w.mode = Fp8LtWeightScales::kPerChannel;
  w.k = 256;
  EXPECT_TRUE(absl::IsInvalidArgument(Fp8GemmLt(call, w, buf, need, nullptr)));
}

// The packed weight scales in cuBLASLt's layouts: 128x128 blocks k-major with the column stride
// rounded up to 4, per-row blocks n-major, per channel as is.
TEST(Fp8GemmLtTest, PacksWeightScalesInCublasLtLayouts) {
  const int64_t n = 272, k = 400, L = 4;  // 3 row blocks (the last partial), L = ceil(400/128)
  std::vector<float> scales(n * L);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < L; ++b) scales[j * L + b] = static_cast<float>((j / 128) * 10 + b + 1);
  }
  std::vector<uint8_t> codes(n * k);
  QuantGemmArgs a{.n = n,
                  .k = k,
                  .code = QuantCode::kFp8E4M3,
                  .w = codes.data(),
                  .scales = scales.data(),
                  .group_size = 128,
                  .act_quant = ActQuant::kFp8PerTokenGroup,
                  .act_group_size = 128};
  absl::StatusOr<Fp8LtPackedScales> p = Fp8LtPackWeightScales(a);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->mode, Fp8LtWeightScales::kBlock128x128);
  ASSERT_EQ(p->scales.size(), size_t{3 * 4});  // L4 = 4
  for (int64_t q = 0; q < 3; ++q) {
    for (int64_t b = 0; b < L; ++b) EXPECT_EQ(p->scales[q * 4 + b], q * 10 + b + 1);
  }
  scales[200 * L + 1] = 0.5f;  // one row of the second block differs: per-row blocks
  p = Fp8LtPackWeightScales(a);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->mode, Fp8LtWeightScales::kRow128);
  ASSERT_EQ(p->scales.size(), size_t(L * n));
  EXPECT_EQ(p->scales[1 * n + 200], 0.5f);
  EXPECT_EQ(p->scales[3 * n + 271], 24.0f);
  // Groups of 256: each 128-column block takes its group's scale.
  std::vector<float> g256(n * 2);
  for (int64_t j = 0; j < n; ++j) g256[j * 2] = 1.0f, g256[j * 2 + 1] = static_cast<float>(j);
  a.group_size = 256;
  a.scales = g256.data();
  p = Fp8LtPackWeightScales(a);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->mode, Fp8LtWeightScales::kRow128);
  EXPECT_EQ(p->scales[0 * n + 7], 1.0f);
  EXPECT_EQ(p->scales[1 * n + 7], 1.0f);
  EXPECT_EQ(p->scales[2 * n + 7], 7.0f);
  EXPECT_EQ(p->scales[3 * n + 7], 7.0f);
  // Per channel with per-token activations: the scales as they are.
  std::vector<float> ch(n);
  for (int64_t j = 0; j < n; ++j) ch[j] = static_cast<float>(j) + 0.25f;
  a.group_size = k;
  a.scales = ch.data();
  a.act_quant = ActQuant::kFp8PerToken;
  p = Fp8LtPackWeightScales(a);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->mode, Fp8LtWeightScales::kPerChannel);
  EXPECT_EQ(p->scales, ch);
}

}  // namespace
}  // namespace tandem
