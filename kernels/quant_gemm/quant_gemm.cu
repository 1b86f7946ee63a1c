// Skinny (decode, m <= 32) weight-only quantized GEMM: c[m, n] = a[m, k] · dequant(w)[n, k]ᵀ with
// the dequantization fused into the weight stream (quant_gemm.h for the layout). INT8, UINT4 and
// FP8 e4m3 codes (FP8 through the hardware e4m3 -> half conversion, exact).
//
// Design (first version, unmeasured): one warp per output row j, kRowsPerBlock warps per block.
// Lane l reads 16-byte vectors l, l + 32, ... of row j's codes with a non-coherent load (16 int8
// or 32 uint4 weights each, all inside one group since group_size % 32 == 0), dequantizes them
// to fp32 in registers with the group's scale (and zero), and multiplies them with the matching
// columns of every row of a (a is m x k <= 32 x k: it stays in L1/L2). Each lane keeps one fp32
// accumulator per row of a; a warp shuffle reduction then gives the m outputs of row j, which
// lanes 0..m-1 write (+ bias, + old c with accumulate). The weight bytes are read once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;
constexpr int kMaxM = static_cast<int>(kQuantSkinnyMaxM);
constexpr int kSymmetricZero = 8;

template <typename T>
__device__ __forceinline__ float ToF32(T v);
template <>
__device__ __forceinline__ float ToF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF32<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T>
__device__ __forceinline__ T FromF32(float v);
template <>
__device__ __forceinline__ float FromF32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

struct Params {
  const void* a;
  const void* bias;
  void* c;
  const uint8_t* w;
  const float* scales;
  const uint8_t* zeros;
  int m, n, k, group_size, num_groups;
  bool accumulate;
};

enum class Code { kInt8, kUint4, kFp8 };

// kWeights weights of one 16-byte vector, dequantized.
template <Code kCode>
__device__ __forceinline__ void Dequant(const uint4 v, float scale, float zero, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const uint32_t byte = (words[i] >> (8 * b)) & 0xffu;
      if constexpr (kCode == Code::kUint4) {
        out[i * 8 + b * 2] = (static_cast<float>(byte & 0xfu) - zero) * scale;
        out[i * 8 + b * 2 + 1] = (static_cast<float>(byte >> 4) - zero) * scale;
      } else if constexpr (kCode == Code::kFp8) {
        const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3));
        out[i * 4 + b] = __half2float(h) * scale;
      } else {
        out[i * 4 + b] = static_cast<float>(static_cast<int8_t>(byte)) * scale;
      }
    }
  }
}

template <Code kCode, typename TA, typename TC>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock) QuantGemmSkinnyKernel(const Params p) {
  constexpr bool kInt4 = kCode == Code::kUint4;
  constexpr int kWeights = kInt4 ? 32 : 16;  // per 16-byte vector
  const int lane = threadIdx.x % kWarp;
  const int j = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  if (j >= p.n) return;
  const int row_bytes = kInt4 ? p.k / 2 : p.k;
  const uint4* w_row = reinterpret_cast<const uint4*>(p.w + static_cast<int64_t>(j) * row_bytes);
  const TA* a = static_cast<const TA*>(p.a);
  float acc[kMaxM];
#pragma unroll
  for (int i = 0; i < kMaxM; ++i) acc[i] = 0.0f;
  const int vectors = p.k / kWeights;
  for (int v = lane; v < vectors; v += kWarp) {
    const uint4 bits = __ldg(w_row + v);
    const int k0 = v * kWeights;
    const int g = k0 / p.group_size;
    const float scale = p.scales[static_cast<int64_t>(j) * p.num_groups + g];
    const float zero =
        kInt4 ? (p.zeros != nullptr
                     ? static_cast<float>(p.zeros[static_cast<int64_t>(j) * p.num_groups + g])
                     : static_cast<float>(kSymmetricZero))
              : 0.0f;
    float wv[kWeights];
    Dequant<kCode>(bits, scale, zero, wv);
#pragma unroll
    for (int i = 0; i < kMaxM; ++i) {
      if (i < p.m) {
        const TA* a_row = a + static_cast<int64_t>(i) * p.k + k0;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < kWeights; ++t) s += ToF32(a_row[t]) * wv[t];
        acc[i] += s;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxM; ++i) {
    if (i < p.m) {
#pragma unroll
      for (int off = kWarp / 2; off > 0; off /= 2)
        acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], off);
    }
  }
  // Lane i writes row i (acc[] is the same in every lane after the butterfly).
#pragma unroll
  for (int i = 0; i < kMaxM; ++i) {
    if (i < p.m && lane == i) {
      TC* c = static_cast<TC*>(p.c) + static_cast<int64_t>(i) * p.n + j;
      float out = acc[i];
      if (p.bias != nullptr) out += ToF32(static_cast<const TC*>(p.bias)[j]);
      if (p.accumulate) out += ToF32(*c);
      *c = FromF32<TC>(out);
    }
  }
}

template <Code kCode, typename TA, typename TC>
absl::Status Launch(const Params& p, cudaStream_t stream) {
  const dim3 grid((p.n + kRowsPerBlock - 1) / kRowsPerBlock);
  QuantGemmSkinnyKernel<kCode, TA, TC><<<grid, kWarp * kRowsPerBlock, 0, stream>>>(p);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <Code kCode>
absl::Status LaunchDtypes(const QuantGemmArgs& args, const Params& p, cudaStream_t stream) {
  const bool a16 = args.a_dtype == DType::kBF16, c16 = args.c_dtype == DType::kBF16;
  if (a16 && c16) return Launch<kCode, __nv_bfloat16, __nv_bfloat16>(p, stream);
  if (a16) return Launch<kCode, __nv_bfloat16, float>(p, stream);
  if (c16) return Launch<kCode, float, __nv_bfloat16>(p, stream);
  return Launch<kCode, float, float>(p, stream);
}

}  // namespace

absl::Status QuantGemmSkinnyCovers(const QuantGemmArgs& args) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("QuantGemmSkinny: ", why));
  };
  if (args.act_quant != ActQuant::kNone) {
    return bad("activation quantization is not fused (QuantizeActivations first)");
  }
  if (args.code != QuantCode::kUint4 && args.zeros != nullptr) {
    return bad("only uint4 has zero points");
  }
  if (args.m < 0 || args.m > kQuantSkinnyMaxM) {
    return bad(absl::StrCat("m = ", args.m, " (at most ", kQuantSkinnyMaxM, ")"));
  }
  for (DType t : {args.a_dtype, args.c_dtype}) {
    if (t != DType::kBF16 && t != DType::kF32) return bad("a and c must be kBF16 or kF32");
  }
  if (args.k <= 0 || args.k % 32 != 0) return bad(absl::StrCat("k = ", args.k, " % 32 != 0"));
  if (args.group_size != args.k && (args.group_size <= 0 || args.group_size % 32 != 0)) {
    return bad(absl::StrCat("group_size ", args.group_size, " is neither k nor a multiple of 32"));
  }
  if (reinterpret_cast<uintptr_t>(args.w) % 16 != 0) return bad("w is not 16-byte aligned");
  if (args.n > (int64_t{1} << 30) || args.k > (int64_t{1} << 30)) return bad("n or k too large");
  return absl::OkStatus();
}

absl::Status QuantGemmSkinny(const QuantGemmArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(QuantGemmSkinnyCovers(args));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  const Params p{args.a,
                 args.bias,
                 args.c,
                 args.w,
                 args.scales,
                 args.zeros,
                 static_cast<int>(args.m),
                 static_cast<int>(args.n),
                 static_cast<int>(args.k),
                 static_cast<int>(args.group_size),
                 static_cast<int>(QuantNumGroups(args.k, args.group_size)),
                 args.accumulate};
  switch (args.code) {
    case QuantCode::kUint4:
      return LaunchDtypes<Code::kUint4>(args, p, stream);
    case QuantCode::kFp8E4M3:
      return LaunchDtypes<Code::kFp8>(args, p, stream);
    case QuantCode::kInt8:
      break;
  }
  return LaunchDtypes<Code::kInt8>(args, p, stream);
}

}  // namespace tandem
