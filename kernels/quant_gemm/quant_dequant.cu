// The two helpers of a quantized layer's non-skinny paths (quant_gemm.h):
//   QuantDequantize      codes -> dense [n, k] (one thread per 16-byte code vector where the
//                        shape allows, one per element otherwise; the prefill path dequantizes a
//                        layer's weight into a scratch buffer, then runs the dense GEMM on it:
//                        a mixed-input tensor-core GEMM is the fix);
//   QuantizeActivations  dynamic FP8 e4m3 rounding of activations (W8A8's activation side; one
//                        block per row and group: amax, then the rounded values).
// Both use the reference's fp32 arithmetic (IEEE division and multiplication, no contraction),
// so in fp32 they are bit-exact with QuantDequantizeRow / QuantizeActivationRow.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "kernels/common/vec_util.cuh"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

constexpr float kE4M3Max = 448.0f;
constexpr int kSymmetricZero = 8;

__device__ __forceinline__ float E4M3ToF32(uint32_t byte) {
  return __half2float(
      __half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3)));
}

template <typename T>
__device__ __forceinline__ float Load(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Load<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float Load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void Store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

struct DequantParams {
  const uint8_t* w;
  const float* scales;
  const uint8_t* zeros;
  int64_t n, k, group_size, num_groups, row_bytes;
  QuantCode code;
};

template <typename T>
__global__ void DequantKernel(const DequantParams p, T* out) {
  const int64_t total = p.n * p.k;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / p.k, kk = e % p.k;
    const int64_t g = kk / p.group_size;
    float q;
    if (p.code == QuantCode::kUint4) {
      const uint32_t byte = p.w[j * p.row_bytes + kk / 2];
      const int nibble = (kk % 2 == 0) ? (byte & 0xfu) : (byte >> 4);
      const int zero = p.zeros != nullptr ? p.zeros[j * p.num_groups + g] : kSymmetricZero;
      q = static_cast<float>(nibble - zero);
    } else if (p.code == QuantCode::kFp8E4M3) {
      q = E4M3ToF32(p.w[j * p.row_bytes + kk]);
    } else {
      q = static_cast<float>(static_cast<int8_t>(p.w[j * p.row_bytes + kk]));
    }
    Store(out, e, __fmul_rn(q, p.scales[j * p.num_groups + g]));
  }
}

// One thread per 16-byte vector of codes (16 int8 / FP8 or 32 uint4 weights, all in one scale
// group), written as 16-byte stores: the codes are read once and the output written once at
// streaming width. The values are the element kernel's (exact code - zero, one __fmul_rn by
// the scale, one rounding to T), so both are bit-exact with the reference.
template <typename T>
__global__ void DequantVecKernel(const DequantParams p, T* out) {
  const int64_t row_vecs = p.row_bytes / 16;
  const int64_t total = p.n * row_vecs;
  const int weights = p.code == QuantCode::kUint4 ? 32 : 16;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = e / row_vecs, v = e % row_vecs;
    const int64_t k0 = v * weights;
    const int64_t g = k0 / p.group_size;
    const float scale = p.scales[j * p.num_groups + g];
    const uint4 bits = LoadStreaming16(p.w + j * p.row_bytes + v * 16);
    const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
    float q[32];
    if (p.code == QuantCode::kUint4) {
      const int zero = p.zeros != nullptr ? p.zeros[j * p.num_groups + g] : kSymmetricZero;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        q[i] = static_cast<float>(static_cast<int>((words[i / 8] >> (4 * (i % 8))) & 0xfu) - zero);
      }
    } else if (p.code == QuantCode::kFp8E4M3) {
#pragma unroll
      for (int i = 0; i < 16; ++i) q[i] = E4M3ToF32((words[i / 4] >> (8 * (i % 4))) & 0xffu);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        q[i] = static_cast<float>(static_cast<int8_t>((words[i / 4] >> (8 * (i % 4))) & 0xffu));
      }
    }
    T* o = out + j * p.k + k0;
    for (int c = 0; c < weights / 8; ++c) {
      float f[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) f[i] = __fmul_rn(q[8 * c + i], scale);
      if constexpr (sizeof(T) == 2) {
        reinterpret_cast<uint4*>(o)[c] = PackBf16x8(f);
      } else {
        reinterpret_cast<float4*>(o)[2 * c] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4*>(o)[2 * c + 1] = make_float4(f[4], f[5], f[6], f[7]);
      }
    }
  }
}

constexpr int kActThreads = 256;

// Block (row i, group g): x[i, g * group : ...] rounded to e4m3 at that group's scale.
template <typename T>
__global__ void __launch_bounds__(kActThreads)
    QuantizeActKernel(const T* x, T* out, int64_t k, int64_t group) {
  const int64_t row = blockIdx.x;
  const int64_t k0 = blockIdx.y * group;
  const int64_t len = min(group, k - k0);
  const T* xr = x + row * k + k0;
  T* outr = out + row * k + k0;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < len; i += kActThreads) amax = fmaxf(amax, fabsf(Load(xr, i)));
  __shared__ float warp_max[kActThreads / 32];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kActThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  if (amax == 0.0f) {  // the reference leaves an all-zero group as it is
    if (xr != outr) {
      for (int64_t i = threadIdx.x; i < len; i += kActThreads) Store(outr, i, Load(xr, i));
    }
    return;
  }
  const float scale = __fdiv_rn(amax, kE4M3Max);
  for (int64_t i = threadIdx.x; i < len; i += kActThreads) {
    const float v = __fdiv_rn(Load(xr, i), scale);
    const __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
    Store(outr, i, __fmul_rn(E4M3ToF32(code), scale));
  }
}

}  // namespace

absl::Status QuantDequantize(const QuantGemmArgs& args, void* out, DType out_dtype,
                             cudaStream_t stream) {
  if (out_dtype != DType::kF32 && out_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("QuantDequantize: out must be kF32 or kBF16");
  }
  if (args.n < 0 || args.k < 0 || args.group_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("QuantDequantize: n ", args.n, " k ", args.k,
                                                   " group_size ", args.group_size));
  }
  if (args.code != QuantCode::kUint4 && args.zeros != nullptr) {
    return absl::InvalidArgumentError("QuantDequantize: only uint4 has zero points");
  }
  if (args.layout != QuantLayout::kRowMajor) {
    return absl::InvalidArgumentError("QuantDequantize: row-major codes only");
  }
  if (args.n == 0 || args.k == 0) return absl::OkStatus();
  const DequantParams p{args.w,
                        args.scales,
                        args.zeros,
                        args.n,
                        args.k,
                        args.group_size,
                        QuantNumGroups(args.k, args.group_size),
                        QuantRowBytes(args.code, args.k),
                        args.code};
  constexpr int kThreads = 256;
  // The vector kernel: whole 16-byte code vectors per row, each inside one scale group, and
  // 16-byte aligned codes and output rows.
  const bool vec = args.k % 32 == 0 && (args.group_size % 32 == 0 || args.group_size >= args.k) &&
                   reinterpret_cast<uintptr_t>(args.w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec) {
    const int64_t vectors = args.n * (QuantRowBytes(args.code, args.k) / 16);
    const int64_t blocks = std::min<int64_t>((vectors + kThreads - 1) / kThreads, 132 * 16);
    if (out_dtype == DType::kF32) {
      DequantVecKernel<<<blocks, kThreads, 0, stream>>>(p, static_cast<float*>(out));
    } else {
      DequantVecKernel<<<blocks, kThreads, 0, stream>>>(p, static_cast<__nv_bfloat16*>(out));
    }
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  const int64_t blocks = std::min<int64_t>((args.n * args.k + kThreads - 1) / kThreads, 65536);
  if (out_dtype == DType::kF32) {
    DequantKernel<<<blocks, kThreads, 0, stream>>>(p, static_cast<float*>(out));
  } else {
    DequantKernel<<<blocks, kThreads, 0, stream>>>(p, static_cast<__nv_bfloat16*>(out));
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status QuantizeActivations(ActQuant act_quant, int64_t act_group_size, const void* x,
                                 void* out, int64_t m, int64_t k, DType dtype,
                                 cudaStream_t stream) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError("QuantizeActivations: dtype must be kF32 or kBF16");
  }
  if (m < 0 || k < 0 || m > (int64_t{1} << 31) - 1 ||
      (act_quant == ActQuant::kFp8PerTokenGroup &&
       (act_group_size < 1 || QuantNumGroups(k, act_group_size) > 65535))) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeActivations: m ", m, " k ", k, " act_group_size ", act_group_size));
  }
  if (m == 0 || k == 0) return absl::OkStatus();
  const int64_t bytes = m * k * DTypeSize(dtype);
  if (act_quant == ActQuant::kNone) {
    if (x != out) {
      CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out, x, bytes, cudaMemcpyDeviceToDevice, stream));
    }
    return absl::OkStatus();
  }
  const int64_t group = act_quant == ActQuant::kFp8PerToken ? k : act_group_size;
  const dim3 grid(static_cast<unsigned>(m), static_cast<unsigned>(QuantNumGroups(k, group)));
  if (dtype == DType::kF32) {
    QuantizeActKernel<<<grid, kActThreads, 0, stream>>>(static_cast<const float*>(x),
                                                        static_cast<float*>(out), k, group);
  } else {
    QuantizeActKernel<<<grid, kActThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(x),
                                                        static_cast<__nv_bfloat16*>(out), k, group);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
