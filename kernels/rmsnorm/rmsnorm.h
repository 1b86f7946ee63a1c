// RMSNorm with an optional fused residual add:
//   if residual:  residual[t] += input[t];  x = residual[t]   (residual updated in place)
//   else:         x = input[t]
//   out[t] = x / sqrt(mean(x^2) + eps) * weight            (statistics in fp32)
// Rows are strided so the same op normalises per-head slices (QK-norm) in place.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct RmsNormArgs {
  const void* input = nullptr;   // [num_rows, hidden], row stride input_stride, dtype
  void* residual = nullptr;      // [num_rows, hidden] contiguous, dtype; may be null
  const void* weight = nullptr;  // [hidden], dtype
  void* out = nullptr;  // [num_rows, hidden], row stride out_stride, dtype; may alias input
  int64_t num_rows = 0;
  int64_t hidden = 0;
  int64_t input_stride = 0;  // elements between rows; 0 means hidden
  int64_t out_stride = 0;    // elements between rows; 0 means hidden
  float eps = 1e-6f;
  DType dtype = DType::kBF16;  // kF32 or kBF16 (input, residual, weight, out)
};

void RmsNormRef(const RmsNormArgs& args);
absl::Status RmsNorm(const RmsNormArgs& args, cudaStream_t stream);

}  // namespace tandem
