// CUDA RMSNorm with the optional fused residual add; numerics as documented in rmsnorm_ref.cc.
//
// Fast path (bf16, hidden % 8 == 0, hidden <= 8192, 16-byte aligned rows): each row is held in
// registers (up to kMaxVec 16-byte vectors per thread), so input and residual are read once and
// residual and out written once: 4 * hidden * 2 bytes per row with a residual, 2 * ... without.
// Rows of <= 1024 elements (QK-norm heads, small models) take one warp each, 8 rows a block;
// longer rows take a 256-thread block each. Everything else takes the generic two-pass kernel.
#include <cuda_bf16.h>

#include "base/cuda_check.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

namespace tandem {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kMaxVec = 4;

template <int kRowThreads>
__device__ __forceinline__ float RowSum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  if constexpr (kRowThreads > 32) {
    __shared__ float warp_sums[kRowThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    x = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowThreads / 32; ++i) x += warp_sums[i];
  }
  return x;
}

template <int kRowThreads>
__global__ void __launch_bounds__(kBlockThreads)
    RmsNormBf16Kernel(const __grid_constant__ RmsNormArgs args, int64_t in_stride,
                      int64_t out_stride) {
  AllowDependentLaunch();  // a PDL GEMM after us may start streaming its weights (pdl.cuh)
  constexpr int kRowsPerBlock = kBlockThreads / kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  const int64_t nvec = args.hidden / 8;
  // kRowThreads == 32: a warp per row, and a warp past the last row may leave now.
  if (kRowThreads == 32 && row >= args.num_rows) return;
  const uint16_t* in = static_cast<const uint16_t*>(args.input) + row * in_stride;
  uint16_t* res = static_cast<uint16_t*>(args.residual) + row * args.hidden;
  // The weight's loads go out first, with the row's: issued after the reduction they were a
  // second dependent DRAM / L2 round trip on every norm of a decode step.
  const uint4* weight = static_cast<const uint4*>(args.weight);
  uint4 wv[kMaxVec] = {};
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int64_t v = t + j * kRowThreads;
    if (v < nvec) wv[j] = __ldg(weight + v);
  }
  float x[kMaxVec][8];
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int64_t v = t + j * kRowThreads;
    if (v >= nvec) break;
    // A plain load, not the non-coherent path: out may alias input.
    UnpackBf16x8(*reinterpret_cast<const uint4*>(in + v * 8), x[j]);
    if (args.residual != nullptr) {
      float r[8];
      UnpackBf16x8(*reinterpret_cast<const uint4*>(res + v * 8), r);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[j][e] = RoundBf16(x[j][e] + r[e]);
      *reinterpret_cast<uint4*>(res + v * 8) = PackBf16x8(x[j]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_sq = fmaf(x[j][e], x[j][e], sum_sq);
  }
  sum_sq = RowSum<kRowThreads>(sum_sq);
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(args.hidden) + args.eps);
  uint16_t* out = static_cast<uint16_t*>(args.out) + row * out_stride;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int64_t v = t + j * kRowThreads;
    if (v >= nvec) break;
    float w[8], y[8];
    UnpackBf16x8(wv[j], w);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = w[e] * RoundBf16(x[j][e] * inv_rms);
    *reinterpret_cast<uint4*>(out + v * 8) = PackBf16x8(y);
  }
}

// Generic: f32 or bf16, any hidden and stride; one block per row, two passes over global memory.
__global__ void __launch_bounds__(kBlockThreads)
    RmsNormGenericKernel(const __grid_constant__ RmsNormArgs args, int64_t in_stride,
                         int64_t out_stride) {
  const int64_t row = blockIdx.x;
  const bool b16 = args.dtype == DType::kBF16;
  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < args.hidden; i += kBlockThreads) {
    float v = LoadAny(args.input, b16, row * in_stride + i);
    if (args.residual != nullptr) {
      v += LoadAny(args.residual, b16, row * args.hidden + i);
      if (b16) v = RoundBf16(v);
      StoreAny(args.residual, b16, row * args.hidden + i, v);
    }
    sum_sq = fmaf(v, v, sum_sq);
  }
  sum_sq = RowSum<kBlockThreads>(sum_sq);  // its barrier also orders pass 1 before pass 2
  const float inv_rms = rsqrtf(sum_sq / static_cast<float>(args.hidden) + args.eps);
  for (int64_t i = threadIdx.x; i < args.hidden; i += kBlockThreads) {
    const float v = args.residual != nullptr ? LoadAny(args.residual, b16, row * args.hidden + i)
                                             : LoadAny(args.input, b16, row * in_stride + i);
    float normed = v * inv_rms;
    if (b16) normed = RoundBf16(normed);
    StoreAny(args.out, b16, row * out_stride + i, LoadAny(args.weight, b16, i) * normed);
  }
}

}  // namespace

absl::Status RmsNorm(const RmsNormArgs& args, cudaStream_t stream) {
  if (args.dtype != DType::kF32 && args.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("RmsNorm: dtype must be f32 or bf16");
  }
  if (args.num_rows < 0 || args.hidden <= 0) {
    return absl::InvalidArgumentError("RmsNorm: needs num_rows >= 0 and hidden > 0");
  }
  if (args.num_rows == 0) return absl::OkStatus();
  const int64_t in_stride = args.input_stride > 0 ? args.input_stride : args.hidden;
  const int64_t out_stride = args.out_stride > 0 ? args.out_stride : args.hidden;
  const bool vec_ok = args.dtype == DType::kBF16 && args.hidden % 8 == 0 && in_stride % 8 == 0 &&
                      out_stride % 8 == 0 && Aligned16(args.input) && Aligned16(args.out) &&
                      Aligned16(args.weight) &&
                      (args.residual == nullptr || Aligned16(args.residual));
  if (vec_ok && args.hidden <= 32 * 8 * kMaxVec) {
    constexpr int kRows = kBlockThreads / 32;
    const int64_t blocks = (args.num_rows + kRows - 1) / kRows;
    RmsNormBf16Kernel<32><<<blocks, kBlockThreads, 0, stream>>>(args, in_stride, out_stride);
  } else if (vec_ok && args.hidden <= kBlockThreads * 8 * kMaxVec) {
    RmsNormBf16Kernel<kBlockThreads>
        <<<args.num_rows, kBlockThreads, 0, stream>>>(args, in_stride, out_stride);
  } else {
    RmsNormGenericKernel<<<args.num_rows, kBlockThreads, 0, stream>>>(args, in_stride, out_stride);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
