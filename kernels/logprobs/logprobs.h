// Log-probabilities of rows of fp32 logits (OpenAI `logprobs` / `top_logprobs`, vLLM's sampler
// output): for row r, logprob(i) = logit[i] - logsumexp(row), of the sampled token tokens[r] and
// of the row's N = num_top[r] most likely tokens.
//
// Semantics per row (the CPU reference defines them; the CUDA kernel follows):
//   - num_top[r] < 0 (the engine passes -1): the row wants no logprobs; its outputs are untouched.
//     Otherwise N = min(num_top[r], kMaxTopLogprobs).
//   - logsumexp = m + log(s), m = the row's max logit, s = sum_i exp(logit[i] - m); the final
//     logprob(i) = float((double(logit[i]) - m) - log(double(s))), one rounding to fp32.
//     The reference sums fp32 exp(logit - m) in double; the CUDA kernel sums __expf in fp32
//     (per-lane partial sums combined in a fixed order), then takes the same double step.
//     Accuracy of the kernel against the exact value (tested): |error| <= 1e-5 for logits of
//     magnitude <= 30 over a vocabulary of 152064; in general half an fp32 ulp of the result
//     plus the relative error of the fp32 sum (a few 1e-6 at worst; WORKLOG.md derives it).
//     Results do not depend on the batch or on thread order.
//   - -inf logits are allowed (masked tokens): their logprob is -inf; a row whose only finite
//     logit is t gives logprob(t) = 0.
//   - An undefined distribution never passes silently: a row with a NaN or +inf logit, or with
//     every logit -inf (torch.log_softmax gives NaN there too), gets token_logprob = NaN and its N
//     top entries (-1, NaN).
//   - top entries: the N largest logits in descending order, ties (equal logits, -0 == +0) to the
//     lower id first, with their logprobs (so non-increasing). Entries N .. kMaxTopLogprobs - 1 of
//     the row are untouched; when the vocabulary has fewer than N tokens, the entries past it are
//     (-1, -inf).
//   - tokens[r] outside [0, vocab_size) gives token_logprob = NaN (no memory is read for it).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

// OpenAI's cap on top_logprobs.
inline constexpr int kMaxTopLogprobs = 20;

struct LogprobsArgs {
  const float* logits = nullptr;     // [batch, vocab_size] fp32, row-major (the processed logits)
  const int32_t* tokens = nullptr;   // [batch] the sampled token ids
  const int32_t* num_top = nullptr;  // [batch] N in [0, kMaxTopLogprobs], or -1: row skipped
  float* token_logprob = nullptr;    // [batch] logprob of tokens[r]
  int32_t* top_tokens = nullptr;     // [batch, kMaxTopLogprobs]; first N of row r written
  float* top_logprobs = nullptr;     // [batch, kMaxTopLogprobs]; first N of row r written
  int64_t batch = 0;
  int64_t vocab_size = 0;
};

// InvalidArgument for a negative batch, a vocabulary outside [1, 2^31), or a null pointer while
// batch > 0. Reads no array.
absl::Status ValidateLogprobsArgs(const LogprobsArgs& args);

// The CPU reference (multi-threaded over rows). CHECK-fails on arguments that
// ValidateLogprobsArgs rejects (a caller's bug, not user input).
void LogprobsRef(const LogprobsArgs& args);

// CUDA (sm_90a): a cluster of 8 CTAs per row (WORKLOG.md). Every pointer is device memory.
// Returns ValidateLogprobsArgs' error, or a launch error.
absl::Status Logprobs(const LogprobsArgs& args, cudaStream_t stream);

}  // namespace tandem
