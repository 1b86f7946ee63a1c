// Verification of one sequence's proposals against the target's forward over them (q_len = 1 +
// proposals): which proposals are accepted and which tokens the step emits.
//
// Row i of the target (i = 0 .. m) is the target's next-token distribution p_i after the sequence
// and the proposals d_0 .. d_{i-1}; t_i is the target's own sample from it (the backend's
// sampler, with the request's seed and step num_output + i).
//   Point-mass proposals (n-gram lookup, greedy drafts; `q` empty): accept d_i while t_i == d_i,
//     then emit t_j at the first mismatch j (or the bonus t_m). This is the lossless rule of
//     Leviathan et al. / Chen et al. for q = δ(d): accept with probability min(1, p(d) / 1) =
//     p(d), else draw from max(0, p − δ(d)) normalised = p conditioned on x ≠ d — exactly what
//     "sample t from p, accept iff t == d, else emit t" does. For greedy rows p is itself a point
//     mass (the argmax), so greedy output equals non-speculative output token for token; sampled
//     rows also equal it for the same seed, since row i draws with the same (seed, step).
//   Drawn proposals (a draft's sampled rows; `q` and `p` given): accept d_i with probability
//     min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from max(0, p_i − q_i) normalised
//     and stop; if all m are accepted, emit the bonus t_m. The emitted tokens are distributed as
//     the target's (tests/engine/spec/spec_distribution_test.cc). The uniforms come from the
//     request's seed (its own stream, not the sampler's) and the row's step.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/spec/speculative_config.h"

namespace tandem {

struct VerifyInput {
  absl::Span<const int32_t> proposals;      // d_0 .. d_{m-1}
  absl::Span<const int32_t> target_tokens;  // t_0 .. t_m
  absl::Span<const std::vector<float>> q;   // [m][vocab], or empty: point masses
  absl::Span<const std::vector<float>> p;   // [m][vocab] when q is given (rows 0 .. m-1)
  uint64_t seed = 0;
  uint64_t first_step = 0;  // the step of row 0 (the request's output tokens so far)
  SpecAcceptance rule = SpecAcceptance::kLossless;
};

struct VerifyResult {
  int num_accepted = 0;         // proposals accepted (the emitted tokens but the last)
  std::vector<int32_t> tokens;  // num_accepted + 1 tokens to emit
};

VerifyResult Verify(const VerifyInput& input);

// The uniforms the rule draws for row `step` (acceptance: attempt 0; residual: attempt 1), and
// the ones a draft model samples its proposals with: streams of their own, so that the
// proposals, the acceptance and the target's samples are independent.
double AcceptanceUniform(uint64_t seed, uint64_t step, uint32_t attempt);
double DraftUniform(uint64_t seed, uint64_t step);

}  // namespace tandem
