// The CUDA-core halves of the cuBLASLt FP8 path (fp8_gemm_lt.h):
//   Fp8LtQuantizeActivations  a [m, k] -> e4m3 codes + fp32 scales in the layout cuBLASLt reads
//                             (fp8_gemm_lt_layout.h). One block per row; each thread converts
//                             8 elements (one 16-byte load of bf16); a 128-column group is 16
//                             adjacent lanes, whose amax is a 4-step shuffle; a per-token row is
//                             a block reduction and a second pass over the row (from L1/L2).
//                             The reference's arithmetic (IEEE division, RNE saturating e4m3
//                             conversion), so codes and scales are QuantizeActivationRow's.
//   Fp8LtAddTail              the block modes' last m % 4 rows from the fp32 tail GEMM into c.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/quant_gemm/fp8_gemm_lt_split.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;                          // elements per thread and step
constexpr int kGroupLanes = kFp8LtBlock / kVec;  // 16 lanes per 128-column group
constexpr float kE4M3Max = 448.0f;

struct Vec8 {
  float v[kVec];
};

__device__ __forceinline__ Vec8 Load8(const __nv_bfloat16* row, int64_t c) {
  const uint4 raw = *reinterpret_cast<const uint4*>(row + c * kVec);
  const __nv_bfloat16* h = reinterpret_cast<const __nv_bfloat16*>(&raw);
  Vec8 out;
#pragma unroll
  for (int i = 0; i < kVec; ++i) out.v[i] = __bfloat162float(h[i]);
  return out;
}
__device__ __forceinline__ Vec8 Load8(const float* row, int64_t c) {
  const float4 lo = *reinterpret_cast<const float4*>(row + c * kVec);
  const float4 hi = *reinterpret_cast<const float4*>(row + c * kVec + 4);
  return Vec8{{lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w}};
}

__device__ __forceinline__ float Amax8(const Vec8& x) {
  float m = 0.0f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) m = fmaxf(m, fabsf(x.v[i]));
  return m;
}

// The 8 codes of x at `scale` (> 0), packed little-endian (element 0 in the low byte).
__device__ __forceinline__ uint2 Quantize8(const Vec8& x, float scale) {
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < kVec; i += 2) {
    const float2 pair = make_float2(__fdiv_rn(x.v[i], scale), __fdiv_rn(x.v[i + 1], scale));
    const uint32_t two = __nv_cvt_float2_to_fp8x2(pair, __NV_SATFINITE, __NV_E4M3);
    w[i / 4] |= two << (16 * ((i / 2) % 2));
  }
  return make_uint2(w[0], w[1]);
}

struct QuantParams {
  uint8_t* codes;      // [rows, k]
  float* scales;       // outer: [rows]; block: [groups][main_rows]
  float* tail_scales;  // [groups][4], rows tail_start ..
  int64_t m, k, rows, main_rows, tail_start, groups;
};

// Block mode: row blockIdx.x (pad rows >= m: zero codes, scale 1).
template <typename T>
__global__ void __launch_bounds__(kThreads) QuantGroupKernel(const T* x, const QuantParams p) {
  const int64_t row = blockIdx.x;
  const bool pad = row >= p.m;
  const T* xr = x + row * p.k;
  uint8_t* cr = p.codes + row * p.k;
  const int64_t chunks = p.k / kVec;
  // Every lane of a warp takes part in each shuffle: the loop runs over whole warps (lanes past
  // the last group compute nothing and store nothing).
  const int64_t lanes = p.groups * kGroupLanes;
  for (int64_t c = threadIdx.x; c < (lanes + 31) / 32 * 32; c += kThreads) {
    const bool live = !pad && c < chunks;
    Vec8 v{};
    if (live) v = Load8(xr, c);
    float amax = live ? Amax8(v) : 0.0f;
#pragma unroll
    for (int off = kGroupLanes / 2; off > 0; off /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    }
    const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4M3Max) : 1.0f;
    if (c < chunks) {
      *reinterpret_cast<uint2*>(cr + c * kVec) =
          amax > 0.0f ? Quantize8(v, scale) : make_uint2(0, 0);  // an all-zero group stays zero
    }
    if (c % kGroupLanes == 0 && c < lanes) {
      const int64_t g = c / kGroupLanes;
      if (row < p.main_rows) {
        p.scales[g * p.main_rows + row] = scale;
      } else {
        p.tail_scales[g * kFp8LtTailRows + (row - p.tail_start)] = scale;
      }
    }
  }
}

// Per-token mode: row blockIdx.x, one scale for the whole row (pad rows >= m: zero codes, 1).
template <typename T>
__global__ void __launch_bounds__(kThreads) QuantRowKernel(const T* x, const QuantParams p) {
  const int64_t row = blockIdx.x;
  const bool pad = row >= p.m;
  const T* xr = x + row * p.k;
  uint8_t* cr = p.codes + row * p.k;
  const int64_t chunks = p.k / kVec;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < chunks && !pad; c += kThreads) {
    amax = fmaxf(amax, Amax8(Load8(xr, c)));
  }
  __shared__ float warp_max[kThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = amax > 0.0f ? __fdiv_rn(amax, kE4M3Max) : 1.0f;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads) {
    *reinterpret_cast<uint2*>(cr + c * kVec) =
        amax > 0.0f ? Quantize8(Load8(xr, c), scale) : make_uint2(0, 0);
  }
  if (threadIdx.x == 0) {
    p.scales[row] = scale;
    if (row >= p.tail_start) p.tail_scales[row - p.tail_start] = scale;
  }
}

__global__ void AddTailKernel(const float* tail, const __nv_bfloat16* bias, __nv_bfloat16* c,
                              int64_t n, int64_t tail_start, int64_t rows, bool accumulate) {
  const int64_t total = rows * n;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e % n;
    float v = tail[e];  // tail row r = e / n is c's row tail_start + r
    if (bias != nullptr) v += __bfloat162float(bias[j]);
    __nv_bfloat16* out = c + tail_start * n + e;
    if (accumulate) v += __bfloat162float(*out);
    *out = __float2bfloat16_rn(v);
  }
}

// Four adjacent outputs per thread (n % 4 == 0, so they share a row): the parts' fp32 sums in
// order 0 .. splits - 1, then the bias, then c, rounded once.
__global__ void SumPartsKernel(const float4* parts, int splits, int64_t part_vecs,
                               const __nv_bfloat16* bias, __nv_bfloat16* c, int64_t n,
                               bool accumulate) {
  for (int64_t v = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; v < part_vecs;
       v += int64_t{gridDim.x} * blockDim.x) {
    float4 sum = parts[v];
    for (int s = 1; s < splits; ++s) {
      const float4 q = parts[s * part_vecs + v];
      sum.x += q.x;
      sum.y += q.y;
      sum.z += q.z;
      sum.w += q.w;
    }
    const int64_t e = v * 4;
    if (bias != nullptr) {
      const int64_t j = e % n;
      sum.x += __bfloat162float(bias[j]);
      sum.y += __bfloat162float(bias[j + 1]);
      sum.z += __bfloat162float(bias[j + 2]);
      sum.w += __bfloat162float(bias[j + 3]);
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(c + e);
    if (accumulate) {
      const float2 lo = __bfloat1622float2(out[0]), hi = __bfloat1622float2(out[1]);
      sum.x += lo.x;
      sum.y += lo.y;
      sum.z += hi.x;
      sum.w += hi.y;
    }
    out[0] = __floats2bfloat162_rn(sum.x, sum.y);
    out[1] = __floats2bfloat162_rn(sum.z, sum.w);
  }
}

}  // namespace

absl::Status Fp8LtSumParts(const float* parts, int splits, const void* bias, void* c, int64_t m,
                           int64_t n, bool accumulate, cudaStream_t stream) {
  if (m <= 0 || n <= 0) return absl::OkStatus();
  if (n % 4 != 0 || splits < 1) {
    return absl::InvalidArgumentError(absl::StrCat("Fp8LtSumParts: n ", n, " splits ", splits));
  }
  constexpr int kSumThreads = 256;
  const int64_t vecs = m * n / 4;
  const int64_t blocks = std::min<int64_t>((vecs + kSumThreads - 1) / kSumThreads, 4096);
  SumPartsKernel<<<static_cast<unsigned>(blocks), kSumThreads, 0, stream>>>(
      reinterpret_cast<const float4*>(parts), splits, vecs, static_cast<const __nv_bfloat16*>(bias),
      static_cast<__nv_bfloat16*>(c), n, accumulate);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Fp8LtQuantizeActivations(const QuantGemmArgs& args, void* scratch,
                                      int64_t scratch_bytes, cudaStream_t stream) {
  RETURN_IF_ERROR(Fp8LtCovers(args));
  const Fp8LtScratchLayout l =
      Fp8LtLayout(args.act_quant == ActQuant::kFp8PerTokenGroup, args.m, args.k, args.n);
  if (scratch == nullptr || scratch_bytes < l.bytes ||
      (reinterpret_cast<uintptr_t>(scratch) & 255u) != 0 ||
      (reinterpret_cast<uintptr_t>(args.a) & 15u) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Fp8LtQuantizeActivations: needs a 256-byte aligned scratch of ", l.bytes,
                     " bytes (got ", scratch_bytes, ") and 16-byte aligned a"));
  }
  if (args.m <= 0) return absl::OkStatus();
  if (l.rows > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(absl::StrCat("Fp8LtQuantizeActivations: m ", args.m));
  }
  uint8_t* base = static_cast<uint8_t*>(scratch);
  const QuantParams p{base + l.codes,
                      reinterpret_cast<float*>(base + l.scales),
                      reinterpret_cast<float*>(base + l.tail_scales),
                      args.m,
                      args.k,
                      l.rows,
                      l.main_rows,
                      l.tail_start,
                      l.groups};
  const unsigned grid = static_cast<unsigned>(l.rows);
  const bool bf16 = args.a_dtype == DType::kBF16;
  if (l.block) {
    if (bf16) {
      QuantGroupKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(args.a), p);
    } else {
      QuantGroupKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(args.a), p);
    }
  } else if (bf16) {  // grid: every row, the pad rows too
    QuantRowKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(args.a), p);
  } else {
    QuantRowKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(args.a), p);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status Fp8LtAddTail(const float* tail, const void* bias, void* c, int64_t n,
                          int64_t tail_start, int64_t m, bool accumulate, cudaStream_t stream) {
  const int64_t rows = m - tail_start;
  if (rows <= 0 || n <= 0) return absl::OkStatus();
  constexpr int kTailThreads = 256;
  const int64_t blocks = std::min<int64_t>((rows * n + kTailThreads - 1) / kTailThreads, 4096);
  AddTailKernel<<<static_cast<unsigned>(blocks), kTailThreads, 0, stream>>>(
      tail, static_cast<const __nv_bfloat16*>(bias), static_cast<__nv_bfloat16*>(c), n, tail_start,
      rows, accumulate);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
