// The two helpers of a quantized layer's non-skinny paths (quant_gemm.h):
//   QuantDequantize      codes -> dense [n, k] (one thread per output element; the prefill path
//                        dequantizes a layer's weight into a scratch buffer, then runs the dense
//                        GEMM on it: correct first, a mixed-input tensor-core GEMM is the fix);
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
