// Linear layer: c[m, n] = a[m, k] · w[n, k]ᵀ (+ bias[n]), the layout of a Hugging Face
// nn.Linear weight. Accumulation in fp32. The CUDA entry point picks a skinny split-K kernel for
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
};

void GemmRef(const GemmArgs& args);
absl::Status Gemm(const GemmArgs& args, cudaStream_t stream);

}  // namespace tandem
