// Linear layer: c[m, n] = a[m, k] · w[n, k]ᵀ (+ bias[n]), the layout of a Hugging Face
// nn.Linear weight; optionally c += ... (accumulate: the residual add fused into the GEMM) and
// a normalised on the fly (a_norm_weight: the RMSNorm before the GEMM fused into it). Accumulation
// in fp32. The CUDA entry point picks a skinny split-K kernel for
// small m (decode) and cuBLASLt for large m behind this one interface.
//
// Batch invariance (GemmRef): c[i, j] is the fp32 sum of a[i, kk] * w[j, kk] in increasing kk,
// whatever m and n are, so a row's result does not depend on the rows batched with it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct GemmArgs {
  const void* a = nullptr;     // [m, k] row-major, a_dtype (activations)
  const void* w = nullptr;     // [n, k] row-major, w_dtype (weights)
  const void* bias = nullptr;  // [n], c_dtype; may be null
  void* c = nullptr;           // [m, n] row-major, c_dtype
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  DType a_dtype = DType::kBF16;  // kF32 or kBF16
  DType w_dtype = DType::kBF16;  // kF32 or kBF16 (quantized formats come later)
  DType c_dtype = DType::kBF16;  // kF32 or kBF16
  // Programmatic dependent launch (PDL, sm_90) of the skinny kernel (GemmSkinny, and Gemm() where
  // it picks that kernel; cuBLASLt and the fallback ignore it). The kernel may then start while
  // the previous kernel in the stream is still running: it issues its first weight loads at once,
  // waits for that kernel to complete before it reads a or bias or writes c, and lets the next
  // kernel, if PDL-launched too, start early in turn. In a chain (a CUDA graph of a decode step)
  // this overlaps each launch's ramp-up with the previous kernel's drain; kernels that produce a
  // GEMM's input can release it early (kernels/common/pdl.cuh). Contract: w is not written by any
  // kernel that may still be running (weights are written once at load time); a, bias and c have
  // the usual stream-order semantics. On by default since the H200 run of
  // kernels/gemm/WORKLOG.md, step 5 (12288 -> 4096 in a graph chain: 26.0 -> 24.6 us, isolated
  // launches unchanged); false gives the plain launch.
  bool overlap_launch = true;
  // c += a · wᵀ (+ bias) instead of c = ...: c is read, in c_dtype, and the sum rounded once
  // (o_proj and down_proj add into the residual stream in place). Every path: the skinny kernel,
  // the fallback, and cuBLASLt (beta = 1), whose bf16 kernels may round a · wᵀ to bf16 before
  // adding c: measured on an H100 (CUDA 13.0), up to 2 bf16 ulps of the sum at k = 264 where c
  // and the product nearly cancel, i.e. half an ulp of the product beyond one rounding. With a
  // bias as well it rounds a · wᵀ + bias first (4 ulps measured), so Gemm() sends that
  // combination to the fallback and GemmCublasLt refuses it.
  bool accumulate = false;
  // When set, each row of a is replaced by its RMSNorm before the product,
  //   a[i, :] * a_norm_weight[:] / sqrt(mean(a[i, :]^2) + a_norm_eps)   (fp32, never stored),
  // which is the norm in front of QKV and gate-up fused into the GEMM: the 1 / rms scale of a row
  // is a scalar, so it is applied to the row's dot products after the k loop. Only the skinny
  // kernel at m = 1 does this (GemmFusesNorm; batch-1 decode): other m, GemmCublasLt and
  // GemmFallback return InvalidArgument.
  const void* a_norm_weight = nullptr;  // [k], a_dtype
  float a_norm_eps = 1e-6f;
};

void GemmRef(const GemmArgs& args);

// CUDA. Dispatch: bf16 a and w with k % 8 == 0 and 16-byte-aligned a/w take the skinny kernel
// for m <= kSkinnyMaxM and cuBLASLt above (n % 8 == 0 and aligned c too); anything else takes a
// slow generic fallback kernel (any dtype mix, any k and n). Bias, when present, has c_dtype.
absl::Status Gemm(const GemmArgs& args, cudaStream_t stream);

// Largest m the skinny kernel serves inside Gemm(): from m = 4 on cuBLASLt streams the weights
// faster than the CUDA-core skinny kernel (kernels/gemm/WORKLOG.md), so only m = 1 uses it.
inline constexpr int64_t kSkinnyMaxM = 1;

// Whether Gemm() can take GemmArgs::a_norm_weight for m rows (the skinny kernel serves them).
inline bool GemmFusesNorm(int64_t m) { return m >= 1 && m <= kSkinnyMaxM; }

// The paths behind Gemm(), exposed for tests and benchmarks. Each returns InvalidArgument when
// its alignment or dtype requirements are not met (the fallback has none).
absl::Status GemmSkinny(const GemmArgs& args, cudaStream_t stream);  // m <= 16
// GemmCublasLt's plans (per m, n, k, c dtype, bias) take the heuristic's first algorithm, or with
// TANDEM_LT_AUTOTUNE=1 the fastest of its candidates, timed on the plan's first call, which then
// allocates scratch outputs and synchronises (kernels/common/cublaslt_autotune.h; untimed under
// graph capture).
absl::Status GemmCublasLt(const GemmArgs& args, cudaStream_t stream);  // any m
absl::Status GemmFallback(const GemmArgs& args, cudaStream_t stream);

// Creates the current device's cuBLASLt handle and workspace (32 MiB). Gemm() does this lazily;
// call it before capturing a CUDA graph, since allocation is not allowed during capture.
absl::Status GemmInitDevice();

}  // namespace tandem
