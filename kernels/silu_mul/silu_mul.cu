// CUDA SiLU-and-mul; numerics as documented in silu_mul_ref.cc (silu rounded to bf16, then the
// product rounded). Fast path: bf16 with intermediate % 8 == 0 and 16-byte aligned buffers, a
// grid-stride loop over 16-byte vectors (reads 2 vectors, writes 1). Otherwise element-wise.
#include <cuda_bf16.h>

#include "base/cuda_check.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/silu_mul/silu_mul.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

__global__ void __launch_bounds__(kThreads)
    SiluMulBf16Kernel(const __grid_constant__ SiluMulArgs args) {
  AllowDependentLaunch();  // a PDL GEMM after us may start streaming its weights (pdl.cuh)
  const int64_t vec_per_row = args.intermediate / 8;
  const int64_t total = args.num_tokens * vec_per_row;
  const uint4* in = static_cast<const uint4*>(args.gate_up);
  uint4* out = static_cast<uint4*>(args.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / vec_per_row, v = i % vec_per_row;
    float g[8], u[8], y[8];
    UnpackBf16x8(LoadStreaming16(in + row * 2 * vec_per_row + v), g);
    UnpackBf16x8(LoadStreaming16(in + row * 2 * vec_per_row + vec_per_row + v), u);
#pragma unroll
    for (int e = 0; e < 8; ++e) y[e] = RoundBf16(Silu(g[e])) * u[e];
    out[i] = PackBf16x8(y);
  }
}

__global__ void __launch_bounds__(kThreads)
    SiluMulGenericKernel(const __grid_constant__ SiluMulArgs args) {
  const bool b16 = args.dtype == DType::kBF16;
  const int64_t total = args.num_tokens * args.intermediate;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t row = i / args.intermediate, col = i % args.intermediate;
    const int64_t base = row * 2 * args.intermediate;
    float s = Silu(LoadAny(args.gate_up, b16, base + col));
    if (b16) s = RoundBf16(s);
    StoreAny(args.out, b16, i, s * LoadAny(args.gate_up, b16, base + args.intermediate + col));
  }
}

// Enough blocks to fill every SM several times over; the loops stride past the rest.
constexpr int64_t kMaxBlocks = 132 * 16;

}  // namespace

absl::Status SiluMul(const SiluMulArgs& args, cudaStream_t stream) {
  if (args.dtype != DType::kF32 && args.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("SiluMul: dtype must be f32 or bf16");
  }
  if (args.num_tokens < 0 || args.intermediate < 0) {
    return absl::InvalidArgumentError("SiluMul: negative shape");
  }
  const int64_t total = args.num_tokens * args.intermediate;
  if (total == 0) return absl::OkStatus();
  const bool vec_ok = args.dtype == DType::kBF16 && args.intermediate % 8 == 0 &&
                      Aligned16(args.gate_up) && Aligned16(args.out);
  const int64_t work = vec_ok ? total / 8 : total;
  const int64_t blocks = std::min(kMaxBlocks, (work + kThreads - 1) / kThreads);
  if (vec_ok) {
    SiluMulBf16Kernel<<<blocks, kThreads, 0, stream>>>(args);
  } else {
    SiluMulGenericKernel<<<blocks, kThreads, 0, stream>>>(args);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
