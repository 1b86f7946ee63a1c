// Token sampling for a batch of rows of logits: greedy (temperature == 0) or temperature, then
// top-k, then top-p (nucleus) filtering, drawing with a per-row counter-based random number so a
// (seed, step) pair always gives the same token, whatever the batch around it.
//
// Semantics per row (the CPU reference defines them; the CUDA kernels follow):
//   1. temperature <= 0: argmax, lowest token id on ties (no random draw).
//   2. top-k: keep the tokens whose logit >= the k-th largest logit (ties at the boundary are kept,
//      as Hugging Face's TopKLogitsWarper does). Temperature does not change this set.
//   3. weights w_i = exp((logit_i - max_logit) / temperature) over the kept tokens, computed in
//      f32 as exp2((logit_i - max_logit) * (log2(e) / temperature)).
//      min_p (vLLM's order: after temperature, before top-k and top-p): tokens whose probability
//      is below min_p times the most likely token's are dropped first, i.e. logits below
//      cutoff = max_logit + log2f(min_p) / (log2(e) / temperature) (f32; min_p = 0 gives -inf:
//      nothing dropped). transformers applies min_p after top-p instead; the two differ only for
//      rows that set both.
//   4. top-p: keep the smallest set, in descending weight, whose mass >= top_p of the kept mass
//      (at least one token; ties with the last weight kept), i.e. HF's TopPLogitsWarper after
//      temperature and top-k — the order HF applies them in.
//   5. draw u = SamplingUniform(seed, step) and return the first kept token, in ascending id
//      order, whose cumulative weight exceeds u * (kept mass).
//      Top-p rows without top-k first draw by rejection: for attempt a = 0 .. kTopPAttempts - 1
//      (sampling_rng.h, 32), the token of step 5 over every token (before top-p) with
//      u_a = SamplingUniform(seed, step, a); the first one that top-p keeps is the sample. Only
//      when all of them fall outside the nucleus, step 5 over the nucleus with u_32. Conditioned
//      on landing in the nucleus a draw from the whole distribution is a draw from the nucleus,
//      so the distribution is HF's; the point is speed: a draw that lands above or below the
//      threshold's histogram bin needs neither the exact threshold nor its select
//      (kernels/sampling/README.md). Expected attempts: at most 1 / top_p.
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
  const float* min_p = nullptr;        // [batch] in [0, 1]; 0 means no min_p; null: none
  const uint64_t* seeds = nullptr;     // [batch] per-request seed
  const uint64_t* steps = nullptr;     // [batch] per-request step counter (tokens sampled so far)
  int32_t* out_tokens = nullptr;       // [batch]
  int64_t batch = 0;
  int64_t vocab_size = 0;
};

// The uniform draw in [0, 1) for (seed, step) and attempt (step 5 above): shared by the CPU
// reference and the CUDA kernels.
double SamplingUniform(uint64_t seed, uint64_t step, uint32_t attempt = 0);

void SamplingRef(const SamplingArgs& args);
// The CUDA sampler, one launch on `stream` (vocab_size <= 262144; kernels/sampling/README.md).
absl::Status Sampling(const SamplingArgs& args, cudaStream_t stream);

}  // namespace tandem
