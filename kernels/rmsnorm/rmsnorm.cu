// CUDA RMSNorm with the optional fused residual add; numerics as documented in rmsnorm_ref.cc.
// The fast kernel also serves RmsNormQuant (rmsnorm_quant.h): the same body, then the FP8 codes
// and scales of its bf16 output values instead of (or besides) the bf16 store.
//
// Fast path (bf16, hidden % 8 == 0, hidden <= 8192, 16-byte aligned rows): each row is held in
// registers (up to kMaxVec 16-byte vectors per thread), so input and residual are read once and
// residual and out written once: 4 * hidden * 2 bytes per row with a residual, 2 * ... without.
// Rows of <= 1024 elements (QK-norm heads, small models) take one warp each, 8 rows a block;
// longer rows take a 256-thread block each. Everything else takes the generic two-pass kernel.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rmsnorm/rmsnorm_quant.h"

namespace tandem {
namespace {

constexpr int kBlockThreads = 256;
constexpr int kMaxVec = 4;
constexpr int kGroupLanes = kFp8LtBlock / 8;  // lanes of one 128-column group (8 elements each)
constexpr float kE4M3Max = 448.0f;

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
__device__ __forceinline__ float RowMax(float x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  if constexpr (kRowThreads > 32) {
    __shared__ float warp_max[kRowThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (lane == 0) warp_max[warp] = x;
    __syncthreads();
    x = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowThreads / 32; ++i) x = fmaxf(x, warp_max[i]);
  }
  return x;
}

// What the fast kernel writes besides (or instead of) the bf16 output (rmsnorm_quant.h).
enum class Quant { kNone, kPerToken, kGroup128 };

// Where the quantized kernels write (fp8_gemm_lt_layout.h); unused for Quant::kNone.
struct QuantOut {
  uint8_t* codes = nullptr;      // [rows, k]
  float* scales = nullptr;       // per token: [rows]; groups: [groups][main_rows]
  float* tail_scales = nullptr;  // [groups][4], rows tail_start ..
  int64_t rows = 0, main_rows = 0, tail_start = 0;
};

// The 8 codes of x at `scale` (> 0), packed little-endian (element 0 in the low byte): the
// arithmetic of kernels/quant_gemm/fp8_gemm_lt.cu's Quantize8.
__device__ __forceinline__ uint2 Quantize8(const float (&x)[8], float scale) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 8; i += 2) {
    const float2 pair = make_float2(__fdiv_rn(x[i], scale), __fdiv_rn(x[i + 1], scale));
    const uint32_t two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
    w[i / 4] |= two << (16 * ((i / 2) % 2));
  }
  return make_uint2(w[0], w[1]);
}

// The fast kernel. kQ == kNone: RmsNorm's. Otherwise also the e4m3 codes and scales of the bf16
// output values (args.out null: only those), over q.rows rows: rows >= num_rows are the FP8
// layout's pad rows (read nothing, zero codes, scale 1).
template <int kRowThreads, Quant kQ>
__global__ void __launch_bounds__(kBlockThreads)
    RmsNormBf16Kernel(const __grid_constant__ RmsNormArgs args, int64_t in_stride,
                      int64_t out_stride, const __grid_constant__ QuantOut q) {
  AllowDependentLaunch();  // a PDL GEMM after us may start streaming its weights (pdl.cuh)
  constexpr int kRowsPerBlock = kBlockThreads / kRowThreads;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int t = threadIdx.x % kRowThreads;
  const int64_t nvec = args.hidden / 8;
  const int64_t last_row = kQ == Quant::kNone ? args.num_rows : q.rows;
  // kRowThreads == 32: a warp per row, and a warp past the last row may leave now.
  if (kRowThreads == 32 && row >= last_row) return;
  const bool pad = kQ != Quant::kNone && row >= args.num_rows;  // an FP8 pad row
  const uint16_t* in = static_cast<const uint16_t*>(args.input) + row * in_stride;
  uint16_t* res = static_cast<uint16_t*>(args.residual) + row * args.hidden;
  // The weight's loads go out first, with the row's: issued after the reduction they were a
  // second dependent DRAM / L2 round trip on every norm of a decode step.
  const uint4* weight = static_cast<const uint4*>(args.weight);
  uint4 wv[kMaxVec] = {};
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int64_t v = t + j * kRowThreads;
    if (v < nvec && !pad) wv[j] = __ldg(weight + v);
  }
  float x[kMaxVec][8];
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxVec; ++j) {
    const int64_t v = t + j * kRowThreads;
    if (v >= nvec || pad) break;
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
  if constexpr (kQ == Quant::kNone) {
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
  } else {
    // The bf16 output values, as the store above rounds them (pad rows and vectors past the row:
    // zero, so they add nothing to an amax).
    float y[kMaxVec][8];
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxVec; ++j) {
      const int64_t v = t + j * kRowThreads;
      const bool live = v < nvec && !pad;
      float w[8];
      UnpackBf16x8(wv[j], w);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        y[j][e] = live ? RoundBf16(w[e] * RoundBf16(x[j][e] * inv_rms)) : 0.0f;
        amax = fmaxf(amax, fabsf(y[j][e]));
      }
      if (live && args.out != nullptr) *reinterpret_cast<uint4*>(out + v * 8) = PackBf16x8(y[j]);
    }
    uint8_t* codes = q.codes + row * args.hidden;
    if constexpr (kQ == Quant::kPerToken) {
      amax = RowMax<kRowThreads>(amax);
      const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4M3Max) : 1.0f;
#pragma unroll
      for (int j = 0; j < kMaxVec; ++j) {
        const int64_t v = t + j * kRowThreads;
        if (v >= nvec) break;
        *reinterpret_cast<uint2*>(codes + v * 8) =
            amax > 0.0f ? Quantize8(y[j], scale) : make_uint2(0, 0);
      }
      if (t == 0) {
        q.scales[row] = scale;
        if (row >= q.tail_start) q.tail_scales[row - q.tail_start] = scale;
      }
    } else {
      // A 128-column group is 16 adjacent lanes (vector v = t + j * kRowThreads, group v / 16,
      // kRowThreads a multiple of 16): its amax is a 4-step shuffle, every lane taking part.
#pragma unroll
      for (int j = 0; j < kMaxVec; ++j) {
        const int64_t v = t + j * kRowThreads;
        if (j * kRowThreads >= nvec) break;  // uniform across the block
        float g = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) g = fmaxf(g, fabsf(y[j][e]));
#pragma unroll
        for (int off = kGroupLanes / 2; off > 0; off /= 2) {
          g = fmaxf(g, __shfl_xor_sync(0xffffffffu, g, off));
        }
        const float scale = g > 0.0f ? __fdiv_rn(g, kE4M3Max) : 1.0f;
        if (v < nvec) {
          *reinterpret_cast<uint2*>(codes + v * 8) =
              g > 0.0f ? Quantize8(y[j], scale) : make_uint2(0, 0);
          if (v % kGroupLanes == 0) {
            const int64_t group = v / kGroupLanes;
            if (row < q.main_rows) {
              q.scales[group * q.main_rows + row] = scale;
            } else {
              q.tail_scales[group * kFp8LtTailRows + (row - q.tail_start)] = scale;
            }
          }
        }
      }
    }
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
    RmsNormBf16Kernel<32, Quant::kNone>
        <<<blocks, kBlockThreads, 0, stream>>>(args, in_stride, out_stride, QuantOut{});
  } else if (vec_ok && args.hidden <= kBlockThreads * 8 * kMaxVec) {
    RmsNormBf16Kernel<kBlockThreads, Quant::kNone>
        <<<args.num_rows, kBlockThreads, 0, stream>>>(args, in_stride, out_stride, QuantOut{});
  } else {
    RmsNormGenericKernel<<<args.num_rows, kBlockThreads, 0, stream>>>(args, in_stride, out_stride);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

namespace {

template <Quant kQ>
void LaunchQuant(const RmsNormArgs& args, int64_t in_stride, int64_t out_stride, const QuantOut& q,
                 cudaStream_t stream) {
  if (args.hidden <= 32 * 8 * kMaxVec) {
    constexpr int kRows = kBlockThreads / 32;
    const int64_t blocks = (q.rows + kRows - 1) / kRows;
    RmsNormBf16Kernel<32, kQ><<<blocks, kBlockThreads, 0, stream>>>(args, in_stride, out_stride, q);
  } else {
    RmsNormBf16Kernel<kBlockThreads, kQ>
        <<<q.rows, kBlockThreads, 0, stream>>>(args, in_stride, out_stride, q);
  }
}

}  // namespace

absl::Status RmsNormQuant(const RmsNormQuantArgs& a, cudaStream_t stream) {
  RETURN_IF_ERROR(RmsNormQuantCovers(a));
  const RmsNormArgs& args = a.norm;
  if (args.num_rows == 0) return absl::OkStatus();
  const bool block = a.act_quant == ActQuant::kFp8PerTokenGroup;
  const Fp8LtScratchLayout l = Fp8LtLayout(block, args.num_rows, args.hidden, 0);
  uint8_t* base = static_cast<uint8_t*>(a.scratch);
  const QuantOut q{base + l.codes,
                   reinterpret_cast<float*>(base + l.scales),
                   reinterpret_cast<float*>(base + l.tail_scales),
                   l.rows,
                   l.main_rows,
                   l.tail_start};
  const int64_t in_stride = args.input_stride > 0 ? args.input_stride : args.hidden;
  const int64_t out_stride = args.out_stride > 0 ? args.out_stride : args.hidden;
  if (block) {
    LaunchQuant<Quant::kGroup128>(args, in_stride, out_stride, q, stream);
  } else {
    LaunchQuant<Quant::kPerToken>(args, in_stride, out_stride, q, stream);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
