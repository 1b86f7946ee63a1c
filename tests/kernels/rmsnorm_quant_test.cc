// RmsNormQuant (kernels/rmsnorm/rmsnorm_quant.h) on the GPU (label gpu; skips without a device):
//   bit-exact with today's two launches, RmsNorm then Fp8LtQuantizeActivations on its bf16
//     output (codes, scales, tail scales, pad rows), with and without the bf16 output, with and
//     without the residual add (which it updates exactly as RmsNorm does);
//   the quantizer half bit-exact with the CPU quantizer (Fp8LtQuantizeRef) on the kernel's bf16
//     output, and the whole within rounding of the CPU reference (RmsNormQuantRef: RmsNormRef's
//     double-precision sum of squares may move a bf16 output by an ulp, and with it a code by one
//     e4m3 step);
//   an output it is told not to write stays untouched (poisoned).
// Rows 1, 3, 5, 17, 300 and 8193 (m % 4: the 4-row tail layout); hidden 896 and 1024 (a warp a
// row), 4096, 8192 (the largest it takes) and, per token, 1000 and 2056 (not multiples of 128;
// 1000 not of 16 either, which the FP8 GEMM refuses: compared with the CPU quantizer only).
#include "kernels/rmsnorm/rmsnorm_quant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

// The bytes a layout defines (codes, scales, tail scales), as one vector for comparisons.
std::vector<uint8_t> Defined(const std::vector<uint8_t>& scratch, const Fp8LtScratchLayout& l,
                             int64_t k) {
  std::vector<uint8_t> out(scratch.begin() + l.codes, scratch.begin() + l.codes + l.rows * k);
  const int64_t scales = l.block ? l.groups * l.main_rows : l.rows;
  out.insert(out.end(), scratch.begin() + l.scales, scratch.begin() + l.scales + 4 * scales);
  const int64_t tail = l.block ? (l.tail ? l.groups * kFp8LtTailRows : 0) : l.rows - l.tail_start;
  out.insert(out.end(), scratch.begin() + l.tail_scales,
             scratch.begin() + l.tail_scales + 4 * tail);
  return out;
}

float ScaleAt(const std::vector<uint8_t>& s, const Fp8LtScratchLayout& l, int64_t i, int64_t g) {
  int64_t off;
  if (!l.block) {
    off = l.scales + 4 * i;
  } else if (i < l.main_rows) {
    off = l.scales + 4 * (g * l.main_rows + i);
  } else {
    off = l.tail_scales + 4 * (g * kFp8LtTailRows + (i - l.tail_start));
  }
  float v;
  std::memcpy(&v, &s[off], 4);
  return v;
}

void Check(ActQuant act, int64_t m, int64_t h, bool residual) {
  const bool block = act == ActQuant::kFp8PerTokenGroup;
  SCOPED_TRACE(::testing::Message() << (block ? "group128" : "per-token") << " m " << m
                                    << " hidden " << h << " residual " << residual);
  std::mt19937 rng(static_cast<uint32_t>(m * 1009 + h * 7 + residual + 2 * block));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> x(m * h), res(m * h), w(h);
  for (int64_t i = 0; i < m; ++i) {
    const float mag = std::ldexp(1.0f, static_cast<int>(i % 7) - 3);
    for (int64_t kk = 0; kk < h; ++kk) x[i * h + kk] = F32ToBf16(u(rng) * mag);
    x[i * h + (i * 37) % h] = F32ToBf16(9.0f * mag);  // an outlier: groups get other scales
  }
  for (auto& v : res) v = F32ToBf16(u(rng) * 0.5f);
  for (int64_t kk = 0; kk < h; ++kk) {
    // A weight with a zero 128-column group (that group's values are all zero: scale 1).
    w[kk] = F32ToBf16(kk >= 128 && kk < 256 ? 0.0f : 0.5f + u(rng));
  }
  if (m > 3) std::fill(x.begin() + 3 * h, x.begin() + 4 * h, 0);  // all zero (without residual)
  const Fp8LtScratchLayout l = Fp8LtLayout(block, m, h, 16);
  const int64_t bytes = Fp8LtScratchBytes(m, h, 16);
  DeviceBuffer dx(x), dw(w), dres_a(res), dres_b(res), dres_c(res);
  DeviceBuffer out_a(m * h * 2), out_b(m * h * 2), out_c(m * h * 2);
  DeviceBuffer scratch_a(bytes), scratch_b(bytes), scratch_c(bytes);
  for (DeviceBuffer* b : {&out_a, &out_b, &out_c, &scratch_a, &scratch_b, &scratch_c}) b->Poison();
  const RmsNormArgs norm{.input = dx.get(),
                         .residual = residual ? dres_a.get() : nullptr,
                         .weight = dw.get(),
                         .out = out_a.get(),
                         .num_rows = m,
                         .hidden = h,
                         .eps = 1e-5f,
                         .dtype = DType::kBF16};
  // Today: RmsNorm, then (where the FP8 GEMM takes k) the GEMM's own quantizer.
  ASSERT_TRUE(RmsNorm(norm, nullptr).ok());
  const bool gemm_takes_k = h % 16 == 0;
  if (gemm_takes_k) {
    const QuantGemmArgs q{.a = out_a.get(),
                          .m = m,
                          .n = 16,
                          .k = h,
                          .a_dtype = DType::kBF16,
                          .c_dtype = DType::kBF16,
                          .code = QuantCode::kFp8E4M3,
                          .group_size = block ? 128 : h,
                          .act_quant = act,
                          .act_group_size = 128};
    const absl::Status st = Fp8LtQuantizeActivations(q, scratch_a.get(), bytes, nullptr);
    ASSERT_TRUE(st.ok()) << st;
  }
  // Fused, with the bf16 output and without it.
  RmsNormQuantArgs fused{
      .norm = norm, .act_quant = act, .scratch = scratch_b.get(), .scratch_bytes = bytes};
  fused.norm.residual = residual ? dres_b.get() : nullptr;
  fused.norm.out = out_b.get();
  absl::Status st = RmsNormQuant(fused, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  RmsNormQuantArgs no_out = fused;
  no_out.norm.residual = residual ? dres_c.get() : nullptr;
  no_out.norm.out = nullptr;
  no_out.scratch = scratch_c.get();
  st = RmsNormQuant(no_out, nullptr);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> sa(bytes), sb(bytes), sc(bytes);
  scratch_a.Download(sa.data());
  scratch_b.Download(sb.data());
  scratch_c.Download(sc.data());
  std::vector<uint16_t> oa(m * h), ob(m * h), oc(m * h), ra(m * h), rb(m * h), rc(m * h);
  out_a.Download(oa.data());
  out_b.Download(ob.data());
  out_c.Download(oc.data());
  dres_a.Download(ra.data());
  dres_b.Download(rb.data());
  dres_c.Download(rc.data());
  ASSERT_EQ(ob, oa) << "the fused kernel's bf16 output is not RmsNorm's";
  for (uint16_t v : oc) ASSERT_EQ(v, 0xffff) << "the output it was told not to write was written";
  if (residual) {
    ASSERT_EQ(rb, ra);
    ASSERT_EQ(rc, ra);
  }
  const std::vector<uint8_t> fused_bytes = Defined(sb, l, h);
  ASSERT_EQ(Defined(sc, l, h), fused_bytes) << "codes differ without the bf16 output";
  if (gemm_takes_k) {
    ASSERT_EQ(fused_bytes, Defined(sa, l, h)) << "codes or scales differ from RmsNorm + quantizer";
  }
  // The quantizer half against the CPU one on the kernel's own bf16 output.
  std::vector<uint8_t> cpu(RmsNormQuantScratchBytes(act, m, h), 0);
  Fp8LtQuantizeRef(act, oa.data(), m, h, cpu.data());
  const Fp8LtScratchLayout lc = Fp8LtLayout(block, m, h, 0);
  ASSERT_EQ(Defined(cpu, lc, h), fused_bytes) << "the quantization is not the CPU quantizer's";
  // The whole against the CPU reference from the inputs.
  std::vector<uint16_t> res_ref = res, out_ref(m * h);
  RmsNormQuantArgs ref = fused;
  ref.norm.input = x.data();
  ref.norm.residual = residual ? res_ref.data() : nullptr;
  ref.norm.weight = w.data();
  ref.norm.out = out_ref.data();
  // The scratch contract asks for 256-byte alignment (the device buffers' cudaMalloc gives it):
  // the reference runs on an aligned window of a larger host buffer, then it is copied out.
  std::vector<uint8_t> ref_storage(cpu.size() + 256, 0);
  uint8_t* ref_aligned =
      ref_storage.data() + (256 - reinterpret_cast<uintptr_t>(ref_storage.data()) % 256) % 256;
  ref.scratch = ref_aligned;
  ref.scratch_bytes = static_cast<int64_t>(cpu.size());
  RmsNormQuantRef(ref);
  const std::vector<uint8_t> ref_scratch(ref_aligned, ref_aligned + cpu.size());
  if (residual) {
    ASSERT_EQ(rb, res_ref) << "the residual add is not the reference's";
  }
  const int64_t group = block ? 128 : h;
  int64_t code_steps = 0;
  for (int64_t i = 0; i < l.rows; ++i) {
    for (int64_t g = 0; g * group < h; ++g) {
      const float s = ScaleAt(sb, l, i, g), s_ref = ScaleAt(ref_scratch, lc, i, g);
      ASSERT_NEAR(s, s_ref, std::ldexp(s_ref, -6)) << "row " << i << " group " << g;
      for (int64_t kk = g * group; kk < std::min(h, (g + 1) * group); ++kk) {
        const float got = Fp8E4M3ToF32(sb[l.codes + i * h + kk]) * s;
        const float want = Fp8E4M3ToF32(ref_scratch[lc.codes + i * h + kk]) * s_ref;
        ASSERT_NEAR(got, want, std::fabs(want) / 8 + std::ldexp(s_ref, -8))
            << "row " << i << " column " << kk;
        code_steps += got != want;
      }
    }
  }
  std::cout << (block ? "group128" : "per-token") << " m " << m << " hidden " << h << " residual "
            << residual << ": bit-exact with RmsNorm + quantizer"
            << (gemm_takes_k ? "" : " (n/a: k % 16)") << "; " << code_steps << " of " << m * h
            << " values one e4m3 step from the CPU reference\n";
}

TEST(RmsNormQuantTest, BitExactWithRmsNormThenTheFp8Quantizer) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    std::vector<int64_t> hiddens = {896, 1024, 4096, 8192};
    if (act == ActQuant::kFp8PerToken) hiddens.insert(hiddens.end(), {1000, 2056});
    for (int64_t h : hiddens) {
      for (int64_t m : {1, 3, 5, 17, 300}) Check(act, m, h, /*residual=*/m % 2 == 1);
    }
    Check(act, 8193, 4096, false);
    Check(act, 8193, 1024, true);
  }
}

TEST(RmsNormQuantTest, RefusesBeforeLaunching) {
  TANDEM_SKIP_WITHOUT_GPU();
  DeviceBuffer buf(1 << 20);
  RmsNormQuantArgs a{.norm = RmsNormArgs{.input = buf.get(),
                                         .weight = buf.get(),
                                         .num_rows = 4,
                                         .hidden = 8200,
                                         .dtype = DType::kBF16},
                     .act_quant = ActQuant::kFp8PerToken,
                     .scratch = buf.get(),
                     .scratch_bytes = 1 << 20};
  EXPECT_TRUE(absl::IsInvalidArgument(RmsNormQuant(a, nullptr)));
  a.norm.hidden = 4096;
  a.norm.num_rows = 0;
  EXPECT_TRUE(RmsNormQuant(a, nullptr).ok());  // nothing to do
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem
