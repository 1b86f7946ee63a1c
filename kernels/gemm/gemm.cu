// CUDA GEMM: the skinny kernel for decode (m <= 16), the generic fallback, and the dispatch.
// cuBLASLt (large m) lives in gemm_lt_cuda.cc.
//
// Skinny kernel: c[m, n] = a[m, k] . w[n, k]^T with bf16 a and w, m <= 16 (Gemm() uses it for
// m = 1; larger m are for tests and the benchmark). The cost is reading
// w once (n * k * 2 bytes), so the kernel is built to stream w at HBM bandwidth:
//   - a block of kThreads threads owns kRows consecutive rows of w and splits k across all its
//     threads (split-K inside the block: thread t reads 16-byte vectors t, t + kThreads, ...),
//     so every warp load is 512 contiguous bytes and small n still fills the GPU;
//   - each thread keeps kUnroll * kRows 16-byte loads of w in flight (L1-bypassing, L2 prefetch;
//     LDG.E.128.CONSTANT in SASS),
//     and reads the matching vector of each a row through L1 (a is tiny and shared by all blocks);
//   - fp32 accumulators acc[kRows][kM], reduced by warp shuffles then across warps in shared
//     memory, in a fixed order (deterministic).
// With GemmArgs::overlap_launch the same kernel is launched with programmatic dependent launch
// (kPdl): see the comment at PdlWaitThenRelease.
#include <cuda_bf16.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/gemm/gemm.h"
#include "kernels/gemm/gemm_stream.h"
#include "kernels/gemm/gemm_variants.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One 16-byte vector of a row of a: through the non-coherent cache on the default path; a PDL
// launch starts before the producer of a has finished, so it reads a after its wait with a plain
// load (PdlWaitThenRelease, LoadAfterWait16: kernels/common/pdl.cuh).
template <bool kPdl>
__device__ __forceinline__ uint4 LoadActivation16(const uint4* p) {
  if constexpr (kPdl) {
    return LoadAfterWait16(p);
  } else {
    return __ldg(p);
  }
}

template <int kM, int kRows, bool kPdl, bool kNorm>
__device__ __forceinline__ void AccumulateVector(const GemmArgs& args, const uint4 (&wv)[kRows],
                                                 int64_t v, int64_t kvec, float (&acc)[kRows][kM],
                                                 float (&sumsq)[kM]) {
  const uint4* a = static_cast<const uint4*>(args.a);
  // kNorm, the fused RMSNorm (GemmArgs::a_norm_weight): a's elements are scaled by the norm
  // weight here and their squares summed into sumsq; the row's 1 / rms multiplies its dot
  // products after the block reduction.
  float gf[8];
  if constexpr (kNorm) {
    UnpackBf16x8(__ldg(static_cast<const uint4*>(args.a_norm_weight) + v), gf);
  }
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (m < args.m) {
      float af[8];
      UnpackBf16x8(LoadActivation16<kPdl>(a + m * kvec + v), af);
      if constexpr (kNorm) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          sumsq[m] = fmaf(af[e], af[e], sumsq[m]);
          af[e] *= gf[e];
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[8];
        UnpackBf16x8(wv[r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(af[e], wf[e], acc[r][m]);
      }
    }
  }
}

// kPdl: launched with programmatic dependent launch. The first batch of weight loads is issued
// before the dependency wait (in the loop's first iteration; threads with no k slice wait after
// the loop), so it overlaps the previous kernel's drain; a, bias and c are touched only after it.
// kNorm (m = 1 only): the fused RMSNorm of a (GemmArgs::a_norm_weight), its own instantiation so
// that the kernels without it keep their registers. At m = 1 the tiles the dispatch uses (up to 8
// loads in flight per thread) are capped at 64 registers, without spills (4 blocks of 256 threads
// per SM: one wave for the 512 blocks of 12288 -> 4096); left to itself
// ptxas gave the 8 x 1 tile 78-103 registers (3 or 2 blocks per SM) once the epilogue grew, and
// the down GEMM of a decode step slowed down (engine/bench/README.md, the kernel trace).
template <int kM, int kRows, int kUnroll, typename OutT, bool kPdl, bool kNorm>
__global__ void __launch_bounds__(kThreads, (kM == 1 && kRows * kUnroll <= 8) ? 4 : 1)
    SkinnyGemmKernel(const __grid_constant__ GemmArgs args) {
  static_assert(!kNorm || kM == 1, "the fused norm is instantiated for m = 1 only");
  const int64_t kvec = args.k / 8;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const uint4* w = static_cast<const uint4*>(args.w);
  float acc[kRows][kM] = {};
  float sumsq[kM] = {};
  for (int64_t v0 = threadIdx.x; v0 < kvec; v0 += kThreads * kUnroll) {
    uint4 wv[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        wv[u][r] = (v < kvec && n0 + r < args.n) ? LoadStreaming16(w + (n0 + r) * kvec + v)
                                                 : make_uint4(0, 0, 0, 0);
      }
    }
    if constexpr (kPdl) {
      if (v0 == threadIdx.x) PdlWaitThenRelease();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kThreads;
      if (v < kvec) AccumulateVector<kM, kRows, kPdl, kNorm>(args, wv[u], v, kvec, acc, sumsq);
    }
  }
  if constexpr (kPdl) {
    if (threadIdx.x >= kvec) PdlWaitThenRelease();
  }
  // Block reduction: warp shuffles, then warp partials summed in warp order by one thread each.
  // Slots [kRows * kM, kRows * kM + kM) hold the rows' sums of squares (fused RMSNorm).
  constexpr int kSlots = kRows * kM + (kNorm ? kM : 0);
  __shared__ float partial[kWarps][kSlots];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float x = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
      if (lane == 0) partial[warp][r * kM + m] = x;
    }
  }
  if constexpr (kNorm) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float x = sumsq[m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
      if (lane == 0) partial[warp][kRows * kM + m] = x;
    }
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= kRows * kM) return;
  const int r = t / kM, m = t % kM;
  const int64_t n = n0 + r;
  if (m >= args.m || n >= args.n) return;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kWarps; ++i) sum += partial[i][t];
  if constexpr (kNorm) {
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) ss += partial[i][kRows * kM + m];
    sum *= rsqrtf(ss / static_cast<float>(args.k) + args.a_norm_eps);
  }
  OutT* c = static_cast<OutT*>(args.c) + m * args.n + n;
  if (args.bias != nullptr) sum += static_cast<float>(static_cast<const OutT*>(args.bias)[n]);
  if (args.accumulate) sum += static_cast<float>(*c);
  *c = static_cast<OutT>(sum);
}

// Generic fallback: one warp per output element, any dtype mix, any k and n. Slow; correct.
__global__ void FallbackGemmKernel(const __grid_constant__ GemmArgs args) {
  const int64_t out = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (out >= args.m * args.n) return;
  const int64_t m = out / args.n, n = out % args.n;
  const bool a16 = args.a_dtype == DType::kBF16, w16 = args.w_dtype == DType::kBF16;
  const bool c16 = args.c_dtype == DType::kBF16;
  float sum = 0.0f;
  for (int64_t kk = threadIdx.x % 32; kk < args.k; kk += 32) {
    sum = fmaf(LoadAny(args.a, a16, m * args.k + kk), LoadAny(args.w, w16, n * args.k + kk), sum);
  }
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (threadIdx.x % 32 != 0) return;
  if (args.bias != nullptr) sum += LoadAny(args.bias, c16, n);
  if (args.accumulate) sum += LoadAny(args.c, c16, out);
  StoreAny(args.c, c16, out, sum);
}

// args.overlap_launch: the kPdl kernel with programmatic dependent launch (gemm.h;
// LaunchMaybePdl, kernels/common/pdl.cuh); otherwise the plain launch of the kernel without any
// griddepcontrol instruction.
template <int kM, int kRows, typename OutT, int kUnroll, bool kNorm>
absl::Status LaunchSkinnyKernel(const GemmArgs& args, cudaStream_t stream) {
  const int64_t blocks = (args.n + kRows - 1) / kRows;
  if (!args.overlap_launch) {
    SkinnyGemmKernel<kM, kRows, kUnroll, OutT, false, kNorm><<<blocks, kThreads, 0, stream>>>(args);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(LaunchMaybePdl(SkinnyGemmKernel<kM, kRows, kUnroll, OutT, true, kNorm>,
                                      dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                                      stream, /*pdl=*/true, args));
  return absl::OkStatus();
}

// args.overlap_launch: the kPdl kernel with programmatic dependent launch (gemm.h;
// LaunchMaybePdl, kernels/common/pdl.cuh); otherwise the plain launch of the kernel without any
// griddepcontrol instruction. A fused norm (m = 1; GemmSkinny checks) takes the kNorm kernel.
template <int kM, int kRows, typename OutT, int kUnroll = 2>
absl::Status LaunchSkinny(const GemmArgs& args, cudaStream_t stream) {
  if constexpr (kM == 1) {
    if (args.a_norm_weight != nullptr) {
      return LaunchSkinnyKernel<kM, kRows, OutT, kUnroll, true>(args, stream);
    }
  }
  return LaunchSkinnyKernel<kM, kRows, OutT, kUnroll, false>(args, stream);
}

// Rows of w per block and loads in flight per row, from the variant sweep in WORKLOG.md (step 3):
// 8 rows x 1 load for long rows (k >= 8192), 2 rows x 4 loads otherwise, one row per block
// (4 loads) when n is too small to give every SM a few blocks.
constexpr int64_t kNumSms = 132;
constexpr int64_t kLongRowK = 8192;

template <int kM, typename OutT>
absl::Status LaunchSkinnyRows(const GemmArgs& args, cudaStream_t stream) {
  // acc[kRows][kM] must stay in registers: wide row tiles only for small m.
  if constexpr (kM <= 2) {
    if (args.k >= kLongRowK && args.n / 8 >= 2 * kNumSms) {
      return LaunchSkinny<kM, 8, OutT, 1>(args, stream);
    }
  }
  if constexpr (kM <= 8) {
    if (args.n / 2 >= 2 * kNumSms) return LaunchSkinny<kM, 2, OutT, 4>(args, stream);
  }
  return LaunchSkinny<kM, 1, OutT, 4>(args, stream);
}

template <typename OutT>
absl::Status DispatchSkinnyM(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 1) return LaunchSkinnyRows<1, OutT>(args, stream);
  if (args.m <= 2) return LaunchSkinnyRows<2, OutT>(args, stream);
  if (args.m <= 4) return LaunchSkinnyRows<4, OutT>(args, stream);
  if (args.m <= 8) return LaunchSkinnyRows<8, OutT>(args, stream);
  return LaunchSkinnyRows<16, OutT>(args, stream);
}

bool ValidDtypes(const GemmArgs& args) {
  auto ok = [](DType t) { return t == DType::kF32 || t == DType::kBF16; };
  return ok(args.a_dtype) && ok(args.w_dtype) && ok(args.c_dtype);
}

template <int kM>
absl::Status LaunchVariant(const GemmArgs& args, int variant, cudaStream_t stream) {
  using Bf16 = __nv_bfloat16;
  switch (variant) {
    case 0:
      return LaunchSkinny<kM, 4, Bf16, 2>(args, stream);
    case 1:
      return LaunchSkinny<kM, 2, Bf16, 4>(args, stream);
    case 2:
      return LaunchSkinny<kM, 8, Bf16, 1>(args, stream);
    case 3:
      return LaunchSkinny<kM, 4, Bf16, 4>(args, stream);
    case 4:
      return gemm_internal::LaunchSkinnyStream(args, gemm_internal::SkinnyStream::kPipelined4,
                                               stream);
    case 5:
      return gemm_internal::LaunchSkinnyStream(args, gemm_internal::SkinnyStream::kBulk8, stream);
  }
  return absl::InvalidArgumentError("GemmSkinnyVariant: no such variant");
}

}  // namespace

absl::Status GemmSkinnyVariant(const GemmArgs& args, int variant, cudaStream_t stream) {
  if (args.m < 1 || args.m > 4 || args.c_dtype != DType::kBF16 || args.k % 8 != 0) {
    return absl::InvalidArgumentError("GemmSkinnyVariant: m in [1, 4], bf16, k % 8 == 0");
  }
  if ((variant >= 4 && (args.a_norm_weight != nullptr || args.accumulate)) ||
      (args.a_norm_weight != nullptr && args.m != 1)) {
    return absl::InvalidArgumentError(
        "GemmSkinnyVariant: variants 4 and 5 fuse nothing; a fused norm needs m == 1");
  }
  if (args.m == 1) return LaunchVariant<1>(args, variant, stream);
  return LaunchVariant<4>(args, variant, stream);
}

absl::Status GemmSkinny(const GemmArgs& args, cudaStream_t stream) {
  if (args.a_dtype != DType::kBF16 || args.w_dtype != DType::kBF16 || !ValidDtypes(args)) {
    return absl::InvalidArgumentError("GemmSkinny: a and w must be bf16, c bf16 or f32");
  }
  if (args.m > 16 || args.k % 8 != 0 || !Aligned16(args.a) || !Aligned16(args.w)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmSkinny: needs m <= 16, k % 8 == 0 and 16-byte aligned a and w; got m=", args.m,
        " k=", args.k));
  }
  if (args.a_norm_weight != nullptr && (args.m != 1 || !Aligned16(args.a_norm_weight))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GemmSkinny: a fused RMSNorm (a_norm_weight) needs m == 1 and a 16-byte aligned weight; "
        "got m=",
        args.m));
  }
  if (args.m <= 0 || args.n <= 0) return absl::OkStatus();
  if (args.c_dtype == DType::kBF16) return DispatchSkinnyM<__nv_bfloat16>(args, stream);
  return DispatchSkinnyM<float>(args, stream);
}

absl::Status GemmFallback(const GemmArgs& args, cudaStream_t stream) {
  if (!ValidDtypes(args)) return absl::InvalidArgumentError("Gemm: dtypes must be f32 or bf16");
  if (args.a_norm_weight != nullptr) {
    return absl::InvalidArgumentError("GemmFallback: no fused RMSNorm (a_norm_weight)");
  }
  if (args.m <= 0 || args.n <= 0) return absl::OkStatus();
  constexpr int kWarpsPerBlock = 8;
  const int64_t blocks = (args.m * args.n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  FallbackGemmKernel<<<blocks, kWarpsPerBlock * 32, 0, stream>>>(args);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Gemm(const GemmArgs& args, cudaStream_t stream) {
  if (!ValidDtypes(args)) return absl::InvalidArgumentError("Gemm: dtypes must be f32 or bf16");
  if (args.m < 0 || args.n < 0 || args.k < 0) return absl::InvalidArgumentError("Gemm: shape < 0");
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  const bool bf16_in = args.a_dtype == DType::kBF16 && args.w_dtype == DType::kBF16;
  const bool aligned = args.k % 8 == 0 && Aligned16(args.a) && Aligned16(args.w);
  if (args.a_norm_weight != nullptr && !(bf16_in && aligned && GemmFusesNorm(args.m))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: a fused RMSNorm (a_norm_weight) needs bf16 a and w, k % 8 == 0, aligned a and w and "
        "m <= ",
        kSkinnyMaxM, "; got m=", args.m, " k=", args.k));
  }
  if (bf16_in && aligned && args.m <= kSkinnyMaxM) return GemmSkinny(args, stream);
  if (bf16_in && aligned && args.n % 8 == 0 && Aligned16(args.c) &&
      !(args.accumulate && args.bias != nullptr)) {  // which cuBLASLt rounds twice
    return GemmCublasLt(args, stream);
  }
  return GemmFallback(args, stream);
}

}  // namespace tandem
