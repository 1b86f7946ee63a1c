#include "kernels/bench/fp8_bench.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm_quant.h"

namespace tandem::bench {
namespace {

void Ok(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, std::string(s.message()).c_str());
    std::abort();
  }
}

void* Alloc(size_t bytes) {
  void* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, bytes));
  return p;
}

struct Layout {
  const char* name;  // row prefix fp8.<name>.*
  ActQuant act;
  int64_t group;  // 0: k (per channel)
};
constexpr Layout kLayouts[] = {{"channel", ActQuant::kFp8PerToken, 0},
                               {"block", ActQuant::kFp8PerTokenGroup, kFp8LtBlock}};

// Host scales in quant_gemm.h's layout: per channel, or one per 128x128 block repeated on its rows.
std::vector<float> HostScales(int64_t n, int64_t k, int64_t group) {
  const int64_t groups = QuantNumGroups(k, group);
  std::vector<float> s(n * groups);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t r = group == k ? j : j / 128;
      s[j * groups + g] = 0.001f + 0.0001f * static_cast<float>((r * 7 + g * 3) % 50);
    }
  }
  return s;
}

}  // namespace

void BenchFp8Gemm(const Ceilings& c) {
  // Llama-3-8B: QKV, O, gate-up (fused), down, and lm_head (the engine keeps it in bf16, as
  // vLLM and the FP8 checkpoints do; here for the table of every layer shape).
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 6144}, {4096, 4096}, {4096, 28672}, {14336, 4096}, {4096, 128256}};
  const std::vector<int64_t> ms = {1, 8, 32, 128, 512, 2048, 8192};
  const int64_t max_m = 8192, max_k = 14336, max_n = 128256, max_nk = 128256 * 4096;
  void* a = Alloc(max_m * max_k * 2);
  FillUniformBf16(a, max_m * max_k, 5, -1, 1);
  void* a_rounded = Alloc(max_m * max_k * 2);  // the dequantize path's bf16-rounded activations
  void* out = Alloc(max_m * max_n * 2);
  const int64_t scratch_bytes = Fp8LtScratchBytes(max_m, max_k, max_n);
  void* scratch = Alloc(scratch_bytes);
  void* dense = Alloc(max_nk * 2);  // the dequantize path's bf16 weight
  Ok(Fp8LtInitDevice(), "Fp8LtInitDevice");
  Ok(GemmInitDevice(), "GemmInitDevice");
  for (auto [k, n] : shapes) {
    const size_t w_bytes = n * k;
    const int copies = RotationCopies(w_bytes);
    std::vector<void*> ws(copies);
    for (int i = 0; i < copies; ++i) {
      ws[i] = Alloc(w_bytes);
      FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 20 + i, -1, 1);  // any bytes
    }
    // cuBLASLt bf16 on a bf16 weight of the shape (the dense model's GEMM).
    const int bf16_copies = RotationCopies(w_bytes * 2);
    std::vector<void*> wb(bf16_copies);
    for (int i = 0; i < bf16_copies; ++i) {
      wb[i] = Alloc(w_bytes * 2);
      FillUniformBf16(wb[i], static_cast<int64_t>(w_bytes), 40 + i, -0.05f, 0.05f);
    }
    for (int64_t m : ms) {
      const std::string shape = absl::StrCat("M=", m, " K=", k, " N=", n);
      const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
      auto report = [&](const std::string& kernel, double us) {
        Report(kernel, shape, us, "TFLOP/s", flop * 1e-6 / us, c.bf16_gemm_tflops);
      };
      const int iters = m >= 2048 ? 20 : 50;
      const GemmArgs bf16{.a = a, .c = out, .m = m, .n = n, .k = k};
      report("fp8.bf16_cublaslt", MedianMicros(
                                      [&](int it) {
                                        GemmArgs g = bf16;
                                        g.w = wb[it % bf16_copies];
                                        Ok(GemmCublasLt(g, nullptr), "GemmCublasLt");
                                      },
                                      nullptr, 5, iters));
      for (const Layout& l : kLayouts) {
        const int64_t group = l.group == 0 ? k : l.group;
        const std::vector<float> host_scales = HostScales(n, k, group);
        QuantGemmArgs q{.a = a,
                        .c = out,
                        .m = m,
                        .n = n,
                        .k = k,
                        .a_dtype = DType::kBF16,
                        .c_dtype = DType::kBF16,
                        .code = QuantCode::kFp8E4M3,
                        .scales = host_scales.data(),
                        .group_size = group,
                        .act_quant = l.act,
                        .act_group_size = kFp8LtBlock};
        absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(q);
        Ok(packed.status(), "Fp8LtPackWeightScales");
        float* packed_d = static_cast<float*>(Alloc(packed->scales.size() * 4));
        float* canon_d = static_cast<float*>(Alloc(host_scales.size() * 4));
        BENCH_CUDA(cudaMemcpy(packed_d, packed->scales.data(), packed->scales.size() * 4,
                              cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(canon_d, host_scales.data(), host_scales.size() * 4,
                              cudaMemcpyHostToDevice));
        q.scales = canon_d;
        auto weight = [&](int it) {
          return Fp8LtWeight{.w = static_cast<const uint8_t*>(ws[it % copies]),
                             .scales = packed_d,
                             .n = n,
                             .k = k,
                             .mode = packed->mode};
        };
        const std::string p = absl::StrCat("fp8.", l.name);
        report(p + ".act_quant",
               MedianMicros(
                   [&](int) {
                     Ok(Fp8LtQuantizeActivations(q, scratch, scratch_bytes, nullptr),
                        "Fp8LtQuantizeActivations");
                   },
                   nullptr, 5, iters));
        report(p + ".gemm", MedianMicros(
                                [&](int it) {
                                  Ok(Fp8LtMatmul(q, weight(it), scratch, scratch_bytes, nullptr),
                                     "Fp8LtMatmul");
                                },
                                nullptr, 5, iters));
        report(p + ".total", MedianMicros(
                                 [&](int it) {
                                   Ok(Fp8GemmLt(q, weight(it), scratch, scratch_bytes, nullptr),
                                      "Fp8GemmLt");
                                 },
                                 nullptr, 5, iters));
        // The path CudaOps took before: activations rounded in bf16, the weight dequantized into
        // a bf16 scratch, the bf16 GEMM.
        report(p + ".dequant_path", MedianMicros(
                                        [&](int it) {
                                          QuantGemmArgs x = q;
                                          x.w = static_cast<const uint8_t*>(ws[it % copies]);
                                          Ok(QuantizeActivations(l.act, kFp8LtBlock, a, a_rounded,
                                                                 m, k, DType::kBF16, nullptr),
                                             "QuantizeActivations");
                                          Ok(QuantDequantize(x, dense, DType::kBF16, nullptr),
                                             "QuantDequantize");
                                          Ok(Gemm({.a = a_rounded,
                                                   .w = dense,
                                                   .c = out,
                                                   .m = m,
                                                   .n = n,
                                                   .k = k,
                                                   .overlap_launch = false},
                                                  nullptr),
                                             "Gemm");
                                        },
                                        nullptr, 3, m >= 2048 ? 10 : 20));
        cudaFree(packed_d), cudaFree(canon_d);
      }
    }
    for (void* w : ws) cudaFree(w);
    for (void* w : wb) cudaFree(w);
  }
  cudaFree(a), cudaFree(a_rounded), cudaFree(out), cudaFree(scratch), cudaFree(dense);
}

void BenchFp8NormGemm(const Ceilings& c) {
  // Llama-3-8B's two GEMMs behind a norm: QKV 4096 -> 6144 and gate-up 4096 -> 28672.
  constexpr int64_t k = 4096;
  const std::vector<int64_t> ns = {6144, 28672};
  const std::vector<int64_t> ms = {8, 64, 256, 2048, 8192};
  const int64_t max_m = 8192;
  void* residual = Alloc(max_m * k * 2);
  FillUniformBf16(residual, max_m * k, 7, -2, 2);
  void* gamma = Alloc(k * 2);
  FillUniformBf16(gamma, k, 8, 0.5f, 1.5f);
  void* hidden = Alloc(max_m * k * 2);  // the unfused norm's bf16 output
  void* out = Alloc(max_m * 28672 * 2);
  const int64_t scratch_bytes = Fp8LtScratchBytes(max_m, k, 28672);
  void* scratch = Alloc(scratch_bytes);
  Ok(Fp8LtInitDevice(), "Fp8LtInitDevice");
  for (int64_t n : ns) {
    const size_t w_bytes = n * k;
    const int copies = RotationCopies(w_bytes);
    std::vector<void*> ws(copies);
    for (int i = 0; i < copies; ++i) {
      ws[i] = Alloc(w_bytes);
      FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 60 + i, -1, 1);  // any bytes
    }
    for (int64_t m : ms) {
      const std::string shape = absl::StrCat("M=", m, " K=", k, " N=", n);
      const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * k;
      const int iters = m >= 2048 ? 20 : 50;
      const RmsNormArgs norm{.input = residual,
                             .weight = gamma,
                             .out = hidden,
                             .num_rows = m,
                             .hidden = k,
                             .eps = 1e-5f,
                             .dtype = DType::kBF16};
      for (const Layout& l : kLayouts) {
        const int64_t group = l.group == 0 ? k : l.group;
        const std::vector<float> host_scales = HostScales(n, k, group);
        QuantGemmArgs q{.a = hidden,
                        .c = out,
                        .m = m,
                        .n = n,
                        .k = k,
                        .a_dtype = DType::kBF16,
                        .c_dtype = DType::kBF16,
                        .code = QuantCode::kFp8E4M3,
                        .scales = host_scales.data(),
                        .group_size = group,
                        .act_quant = l.act,
                        .act_group_size = kFp8LtBlock};
        absl::StatusOr<Fp8LtPackedScales> packed = Fp8LtPackWeightScales(q);
        Ok(packed.status(), "Fp8LtPackWeightScales");
        float* packed_d = static_cast<float*>(Alloc(packed->scales.size() * 4));
        BENCH_CUDA(cudaMemcpy(packed_d, packed->scales.data(), packed->scales.size() * 4,
                              cudaMemcpyHostToDevice));
        q.scales = nullptr;
        auto weight = [&](int it) {
          return Fp8LtWeight{.w = static_cast<const uint8_t*>(ws[it % copies]),
                             .scales = packed_d,
                             .n = n,
                             .k = k,
                             .mode = packed->mode};
        };
        const RmsNormQuantArgs fused{.norm = RmsNormArgs{.input = residual,
                                                         .weight = gamma,
                                                         .num_rows = m,
                                                         .hidden = k,
                                                         .eps = 1e-5f,
                                                         .dtype = DType::kBF16},
                                     .act_quant = l.act,
                                     .scratch = scratch,
                                     .scratch_bytes = scratch_bytes};
        const std::string p = absl::StrCat("fp8norm.", l.name);
        // The activation side alone, in TB/s of what each moves: unfused, the norm reads the
        // residual and writes bf16, the quantizer reads it back and writes codes (2 + 2 + 2 + 1
        // bytes an element); fused, residual in and codes out (2 + 1).
        const double elems = static_cast<double>(m) * k;
        const double us_unfused_act = MedianMicros(
            [&](int) {
              Ok(RmsNorm(norm, nullptr), "RmsNorm");
              Ok(Fp8LtQuantizeActivations(q, scratch, scratch_bytes, nullptr),
                 "Fp8LtQuantizeActivations");
            },
            nullptr, 5, iters);
        Report(p + ".norm_then_quant", shape, us_unfused_act, "TB/s",
               7.0 * elems / us_unfused_act * 1e-6, c.copy_tbps);
        const double us_fused_act = MedianMicros(
            [&](int) { Ok(RmsNormQuant(fused, nullptr), "RmsNormQuant"); }, nullptr, 5, iters);
        Report(p + ".norm_quant_fused", shape, us_fused_act, "TB/s",
               3.0 * elems / us_fused_act * 1e-6, c.copy_tbps);
        // With the GEMM: norm -> quantize -> FP8 GEMM (today) against fused norm+quantize ->
        // FP8 GEMM, in TFLOP/s of the GEMM.
        const double us_unfused = MedianMicros(
            [&](int it) {
              Ok(RmsNorm(norm, nullptr), "RmsNorm");
              Ok(Fp8GemmLt(q, weight(it), scratch, scratch_bytes, nullptr), "Fp8GemmLt");
            },
            nullptr, 5, iters);
        Report(p + ".unfused_gemm", shape, us_unfused, "TFLOP/s", flop * 1e-6 / us_unfused,
               c.bf16_gemm_tflops);
        const double us_fused = MedianMicros(
            [&](int it) {
              Ok(Fp8GemmLtWith(q, weight(it), scratch, scratch_bytes, nullptr,
                               [&] { return RmsNormQuant(fused, nullptr); }),
                 "Fp8GemmLtWith");
            },
            nullptr, 5, iters);
        Report(p + ".fused_gemm", shape, us_fused, "TFLOP/s", flop * 1e-6 / us_fused,
               c.bf16_gemm_tflops);
        std::printf(
            "  %s %s: fused %.1f us vs unfused %.1f us (%.1f%% of the unfused time saved)\n",
            p.c_str(), shape.c_str(), us_fused, us_unfused,
            100.0 * (us_unfused - us_fused) / us_unfused);
        cudaFree(packed_d);
      }
    }
    for (void* w : ws) cudaFree(w);
  }
  cudaFree(residual), cudaFree(gamma), cudaFree(hidden), cudaFree(out), cudaFree(scratch);
}

}  // namespace tandem::bench
