// Token sampling for a batch of rows of logits: greedy (temperature == 0) or temperature, then
// top-k, then top-p (nucleus) filtering, drawing with a per-row counter-based random number so a
// (seed, step) pair always gives the same token, whatever the batch around it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

struct SamplingArgs {
  const float* logits = nullptr;       // [batch, vocab_size] fp32
  const float* temperature = nullptr;  // [batch]; 0 means greedy (argmax, lowest id on ties)
  const int32_t* top_k = nullptr;      // [batch]; <= 0 or >= vocab_size means no top-k
  const float* top_p = nullptr;        // [batch] in (0, 1]; 1 means no top-p
  const uint64_t* seeds = nullptr;     // [batch] per-request seed
  const uint64_t* steps = nullptr;     // [batch] per-request step counter (tokens sampled so far)
  int32_t* out_tokens = nullptr;       // [batch]
  int64_t batch = 0;
  int64_t vocab_size = 0;
};

// The uniform draw in [0, 1) for (seed, step): shared by the CPU reference and the CUDA kernel.
double SamplingUniform(uint64_t seed, uint64_t step);

void SamplingRef(const SamplingArgs& args);
absl::Status Sampling(const SamplingArgs& args, cudaStream_t stream);

}  // namespace tandem
