#include "kernels/bench/quant_bench.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/gemm.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem::bench {
namespace {

// Aborts the benchmark with the status's message (a benchmark has no caller to report to).
void OrDie(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

// Points x at copy r of the rotated weights: codes from w (the row-major or the kTc16 copies),
// scales, and zero points for uint4.
void OnCopy(QuantGemmArgs& x, const std::vector<void*>& w, const std::vector<void*>& scales,
            const std::vector<void*>& zeros, int r, bool int4) {
  x.w = static_cast<const uint8_t*>(w[r]);
  x.scales = static_cast<const float*>(scales[r]);
  x.zeros = int4 ? static_cast<const uint8_t*>(zeros[r]) : nullptr;
}

}  // namespace

void BenchQuantGemm(const Ceilings& c) {
  // {k, n}: Qwen3-8B gate_up and down, Llama-3-8B gate_up and down, QKV (Llama GQA), O.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 24576}, {12288, 4096}, {4096, 28672}, {14336, 4096}, {4096, 6144}, {4096, 4096}};
  constexpr int64_t kMaxRows = 64;  // rows of a and c the benchmarks below use at most
  constexpr int64_t kGroup = 128;
  for (QuantCode code : {QuantCode::kInt8, QuantCode::kUint4, QuantCode::kFp8E4M3}) {
    const bool int4 = code == QuantCode::kUint4;
    for (auto [k, n] : shapes) {
      const int64_t groups = int4 ? k / kGroup : 1;
      const size_t w_bytes = n * QuantRowBytes(code, k);
      const size_t bytes = w_bytes + n * groups * (4 + (int4 ? 1 : 0));
      const int copies = RotationCopies(bytes);
      std::vector<void*> ws(copies), scales(copies), zeros(copies);
      for (int i = 0; i < copies; ++i) {
        BENCH_CUDA(cudaMalloc(&ws[i], w_bytes));
        BENCH_CUDA(cudaMalloc(&scales[i], n * groups * 4));
        BENCH_CUDA(cudaMalloc(&zeros[i], n * groups));
        FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 20 + i, -1, 1);  // any bytes
        FillUniformF32(static_cast<float*>(scales[i]), n * groups, 30 + i, 0.001f, 0.01f);
        BENCH_CUDA(cudaMemset(zeros[i], 8, n * groups));
      }
      void* a = nullptr;
      void* out = nullptr;
      BENCH_CUDA(cudaMalloc(&a, kMaxRows * k * 2));
      BENCH_CUDA(cudaMalloc(&out, kMaxRows * n * 2));
      FillUniformBf16(a, kMaxRows * k, 5, -1, 1);
      for (int64_t m : {1, 2, 4}) {
        QuantGemmArgs args{.a = a,
                           .c = out,
                           .m = m,
                           .n = n,
                           .k = k,
                           .a_dtype = DType::kBF16,
                           .c_dtype = DType::kBF16,
                           .code = code,
                           .group_size = int4 ? kGroup : k};
        auto launch = [&](int it) {
          QuantGemmArgs x = args;
          OnCopy(x, ws, scales, zeros, it % copies, int4);
          OrDie(QuantGemmSkinny(x, nullptr));
        };
        MedianMicros(launch, nullptr, 20, 20);  // pre-warm (kernels/gemm/WORKLOG.md, step 3)
        const double us = MedianMicros(launch, nullptr, 5, 50);
        Report(int4                          ? "quant_gemm.w4a16_g128"
               : code == QuantCode::kFp8E4M3 ? "quant_gemm.fp8w_a16"
                                             : "quant_gemm.w8a16",
               absl::StrCat("M=", m, " K=", k, " N=", n), us, "TB/s",
               static_cast<double>(bytes) * 1e-6 / us, c.read_tbps);
      }
      // The prefill path's dequantization into a bf16 scratch (CudaOps): codes and scales read,
      // 2 bytes per weight written.
      void* dense = nullptr;
      BENCH_CUDA(cudaMalloc(&dense, n * k * 2));
      auto dequant = [&](int it) {
        QuantGemmArgs x{.n = n, .k = k, .code = code, .group_size = int4 ? kGroup : k};
        OnCopy(x, ws, scales, zeros, it % copies, int4);
        OrDie(QuantDequantize(x, dense, DType::kBF16, nullptr));
      };
      MedianMicros(dequant, nullptr, 5, 5);
      const double dq_us = MedianMicros(dequant, nullptr, 3, 20);
      Report(int4                          ? "quant_dequant.int4_g128"
             : code == QuantCode::kFp8E4M3 ? "quant_dequant.fp8"
                                           : "quant_dequant.int8",
             absl::StrCat("K=", k, " N=", n), dq_us, "TB/s",
             static_cast<double>(bytes + n * k * 2) * 1e-6 / dq_us, c.read_tbps);
      // The whole non-skinny path (CudaOps::Gemm above kQuantSkinnyMaxM rows): dequantize, then
      // the bf16 Gemm (cuBLASLt) on the scratch, against the skinny rows above at m = 8; "TB/s"
      // counts the quantized bytes, as the skinny rows do.
      for (int64_t m : {4, 8, 16, 32, 64}) {
        auto path = [&](int it) {
          dequant(it);
          const GemmArgs g{.a = a,
                           .w = dense,
                           .c = out,
                           .m = m,
                           .n = n,
                           .k = k,
                           .a_dtype = DType::kBF16,
                           .w_dtype = DType::kBF16,
                           .c_dtype = DType::kBF16,
                           .overlap_launch = false};
          OrDie(Gemm(g, nullptr));
        };
        MedianMicros(path, nullptr, 5, 5);
        const double us = MedianMicros(path, nullptr, 3, 20);
        Report(int4                          ? "quant_dequant_gemm.int4_g128"
               : code == QuantCode::kFp8E4M3 ? "quant_dequant_gemm.fp8"
                                             : "quant_dequant_gemm.int8",
               absl::StrCat("M=", m, " K=", k, " N=", n), us, "TB/s",
               static_cast<double>(bytes) * 1e-6 / us, c.read_tbps);
      }
      cudaFree(dense);
      // The mixed-input tensor-core GEMM (CudaOps above kQuantSkinnyMaxM rows, INT8 / UINT4; at
      // m = 1..4 with TANDEM_QUANT_TC_SMALL_M=1): the codes read once, no scratch; "TB/s" counts
      // the quantized bytes. quant_gemm_tc rows run unsplit (no workspace), quant_gemm_tc_split
      // rows the automatic split-K plan (WORKLOG.md step 8) with its split count in the shape.
      QuantTcWorkspace tcw;
      if (code != QuantCode::kFp8E4M3) {
        const QuantGemmArgs shape{.n = n, .k = k, .code = code, .group_size = int4 ? kGroup : k};
        tcw.partial_floats = QuantGemmTcWorkspaceFloats(shape, 64);
        tcw.num_counters = QuantGemmTcWorkspaceCounters(n);
        BENCH_CUDA(cudaMalloc(&tcw.partials, std::max<int64_t>(tcw.partial_floats, 1) * 4));
        BENCH_CUDA(cudaMalloc(&tcw.counters, tcw.num_counters * 4));
        BENCH_CUDA(cudaMemset(tcw.counters, 0, tcw.num_counters * 4));
      }
      for (const bool split : {false, true}) {
        for (int64_t m : {1, 4, 8, 16, 32, 64}) {
          if (code == QuantCode::kFp8E4M3) break;
          QuantGemmArgs args{.a = a,
                             .c = out,
                             .m = m,
                             .n = n,
                             .k = k,
                             .a_dtype = DType::kBF16,
                             .c_dtype = DType::kBF16,
                             .code = code,
                             .group_size = int4 ? kGroup : k};
          if (split) args.tc_workspace = tcw;
          const int splits = QuantGemmTcPlan(args).splits;
          auto launch = [&](int it) {
            QuantGemmArgs x = args;
            OnCopy(x, ws, scales, zeros, it % copies, int4);
            OrDie(QuantGemmTc(x, nullptr));
          };
          MedianMicros(launch, nullptr, 20, 20);
          const double us = MedianMicros(launch, nullptr, 5, 50);
          Report(
              split ? (int4 ? "quant_gemm_tc_split.w4a16_g128" : "quant_gemm_tc_split.w8a16")
                    : (int4 ? "quant_gemm_tc.w4a16_g128" : "quant_gemm_tc.w8a16"),
              absl::StrCat("M=", m, " K=", k, " N=", n, split ? absl::StrCat(" S=", splits) : ""),
              us, "TB/s", static_cast<double>(bytes) * 1e-6 / us, c.read_tbps);
        }
      }
      // The tensor-core GEMV (QuantGemv: CudaOps' INT8 / UINT4 path at m <= 8), at its default
      // ring depth (D=0) and at 4 and 2, isolated launches as above.
      // The same weights repacked into QuantLayout::kTc16 (QuantRepackTc16), for the D=... T16
      // rows: each warp load 512 contiguous bytes instead of 8 rows' 64-byte pieces.
      std::vector<void*> tiled(copies, nullptr);
      if (code != QuantCode::kFp8E4M3) {
        for (int i = 0; i < copies; ++i) {
          BENCH_CUDA(cudaMalloc(&tiled[i], QuantTc16Bytes(code, n, k)));
          QuantGemmArgs x{.n = n, .k = k, .code = code, .group_size = int4 ? kGroup : k};
          x.w = static_cast<const uint8_t*>(ws[i]);
          OrDie(QuantRepackTc16(x, static_cast<uint8_t*>(tiled[i]), nullptr));
        }
      }
      for (int64_t m : {1, 4, 8}) {
        if (code == QuantCode::kFp8E4M3) break;
        for (int depth : {0, 4, 2, 10, 14, 12}) {
          const bool tc16 = depth >= 10;  // 10 + d: depth d on the tiled copies
          if (tc16) depth -= 10;
          QuantGemmArgs args{.a = a,
                             .c = out,
                             .m = m,
                             .n = n,
                             .k = k,
                             .a_dtype = DType::kBF16,
                             .c_dtype = DType::kBF16,
                             .code = code,
                             .group_size = int4 ? kGroup : k,
                             .gemv_depth = depth,
                             .layout = tc16 ? QuantLayout::kTc16 : QuantLayout::kRowMajor};
          auto launch = [&](int it) {
            QuantGemmArgs x = args;
            OnCopy(x, tc16 ? tiled : ws, scales, zeros, it % copies, int4);
            OrDie(QuantGemv(x, nullptr));
          };
          MedianMicros(launch, nullptr, 20, 20);
          const double us = MedianMicros(launch, nullptr, 5, 50);
          Report(int4 ? "quant_gemv.w4a16_g128" : "quant_gemv.w8a16",
                 absl::StrCat("M=", m, " K=", k, " N=", n, " D=", depth, tc16 ? " T16" : ""), us,
                 "TB/s", static_cast<double>(bytes) * 1e-6 / us, c.read_tbps);
        }
      }
      // Chains: 8 launches back to back with PDL on one stream, timed together, per launch, as a
      // graph-replayed decode step runs its GEMMs (each launch's start overlaps the previous
      // kernel's tail; isolated launches above pay it in full): the skinny kernel, QuantGemmTc
      // (its automatic split plan, as CudaOps runs it) and QuantGemv, at m = 1 and 4.
      cudaStream_t chain_stream = nullptr;
      BENCH_CUDA(cudaStreamCreateWithFlags(&chain_stream, cudaStreamNonBlocking));
      for (int64_t m : {1, 4}) {
        for (const char* kernel : {"skinny", "tc", "gemv", "gemv_tc16"}) {
          const bool tc = std::string(kernel) == "tc", tc16 = std::string(kernel) == "gemv_tc16";
          const bool gemv = tc16 || std::string(kernel) == "gemv";
          if ((tc || gemv) && code == QuantCode::kFp8E4M3) continue;
          QuantGemmArgs args{.a = a,
                             .c = out,
                             .m = m,
                             .n = n,
                             .k = k,
                             .a_dtype = DType::kBF16,
                             .c_dtype = DType::kBF16,
                             .overlap_launch = true,
                             .code = code,
                             .group_size = int4 ? kGroup : k};
          if (tc) args.tc_workspace = tcw;
          if (tc16) args.layout = QuantLayout::kTc16;
          constexpr int kChain = 8;
          auto launch = [&](int it) {
            for (int j = 0; j < kChain; ++j) {
              QuantGemmArgs x = args;
              const int r = (it * kChain + j) % copies;
              OnCopy(x, tc16 ? tiled : ws, scales, zeros, r, int4);
              const absl::Status s = gemv ? QuantGemv(x, chain_stream)
                                     : tc ? QuantGemmTc(x, chain_stream)
                                          : QuantGemmSkinny(x, chain_stream);
              OrDie(s);
            }
          };
          MedianMicros(launch, chain_stream, 5, 5);
          const double us = MedianMicros(launch, chain_stream, 3, 30) / kChain;
          const char* name = int4                          ? "w4a16_g128"
                             : code == QuantCode::kFp8E4M3 ? "fp8w_a16"
                                                           : "w8a16";
          Report(absl::StrCat("quant_chain_", kernel, ".", name),
                 absl::StrCat("M=", m, " K=", k, " N=", n), us, "TB/s",
                 static_cast<double>(bytes) * 1e-6 / us, c.read_tbps);
        }
      }
      cudaStreamDestroy(chain_stream);
      for (void* t : tiled) cudaFree(t);
      cudaFree(tcw.partials), cudaFree(tcw.counters);
      for (int i = 0; i < copies; ++i) cudaFree(ws[i]), cudaFree(scales[i]), cudaFree(zeros[i]);
      cudaFree(a), cudaFree(out);
    }
  }
}

void BenchQuantOne(const std::string& code_name, const std::string& kernel, int64_t m, int64_t k,
                   int64_t n, int depth) {
  const QuantCode code = code_name == "int4" ? QuantCode::kUint4 : QuantCode::kInt8;
  const bool int4 = code == QuantCode::kUint4, tc16 = kernel == "gemv_tc16";
  const int64_t groups = int4 ? k / 128 : 1;
  const size_t w_bytes = n * QuantRowBytes(code, k);
  const int copies = RotationCopies(w_bytes);
  std::vector<void*> ws(copies), scales(copies), zeros(copies);
  for (int i = 0; i < copies; ++i) {
    BENCH_CUDA(cudaMalloc(&ws[i], tc16 ? QuantTc16Bytes(code, n, k) : w_bytes));
    BENCH_CUDA(cudaMalloc(&scales[i], n * groups * 4));
    BENCH_CUDA(cudaMalloc(&zeros[i], n * groups));
    FillUniformBf16(ws[i], static_cast<int64_t>(w_bytes / 2), 20 + i, -1, 1);
    FillUniformF32(static_cast<float*>(scales[i]), n * groups, 30 + i, 0.001f, 0.01f);
    BENCH_CUDA(cudaMemset(zeros[i], 8, n * groups));
  }
  void* a = nullptr;
  void* out = nullptr;
  BENCH_CUDA(cudaMalloc(&a, m * k * 2));
  BENCH_CUDA(cudaMalloc(&out, m * n * 2));
  FillUniformBf16(a, m * k, 5, -1, 1);
  const QuantGemmArgs args{.a = a,
                           .c = out,
                           .m = m,
                           .n = n,
                           .k = k,
                           .a_dtype = DType::kBF16,
                           .c_dtype = DType::kBF16,
                           .code = code,
                           .group_size = int4 ? 128 : k,
                           .gemv_depth = depth,
                           .layout = tc16 ? QuantLayout::kTc16 : QuantLayout::kRowMajor};
  auto launch = [&](int it) {
    QuantGemmArgs x = args;
    OnCopy(x, ws, scales, zeros, it % copies, int4);
    const absl::Status s = kernel == "skinny" ? QuantGemmSkinny(x, nullptr)
                           : kernel == "tc"   ? QuantGemmTc(x, nullptr)
                                              : QuantGemv(x, nullptr);
    OrDie(s);
  };
  const double us = MedianMicros(launch, nullptr, 10, 30);
  std::printf("quantone %s %s M=%lld K=%lld N=%lld D=%d: %.2f us\n", code_name.c_str(),
              kernel.c_str(), static_cast<long long>(m), static_cast<long long>(k),
              static_cast<long long>(n), depth, us);
  for (int i = 0; i < copies; ++i) cudaFree(ws[i]), cudaFree(scales[i]), cudaFree(zeros[i]);
  cudaFree(a), cudaFree(out);
}

}  // namespace tandem::bench
