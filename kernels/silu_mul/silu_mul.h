// SwiGLU activation: out[t, i] = silu(gate_up[t, i]) * gate_up[t, intermediate + i].
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct SiluMulArgs {
  const void* gate_up = nullptr;  // [num_tokens, 2 * intermediate], dtype: gate half, then up half
  void* out = nullptr;            // [num_tokens, intermediate], dtype
  int64_t num_tokens = 0;
  int64_t intermediate = 0;
  DType dtype = DType::kBF16;  // kF32 or kBF16
};

void SiluMulRef(const SiluMulArgs& args);
absl::Status SiluMul(const SiluMulArgs& args, cudaStream_t stream);

}  // namespace tandem
