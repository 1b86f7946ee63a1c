// The distribution a sampling row draws its token from, on the host: the row's logits processed
// as the backend's sampler does (penalties and biases, kernels/logits_process) and filtered as
// kernels/sampling/sampling.h defines (temperature, min_p, top-k, top-p); a greedy row is a point
// mass on the argmax. The lossless acceptance rule (verify.h) needs the target's and the draft's
// distributions, not just their samples.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/step_inputs.h"

namespace tandem {

// `logits` is logits row `row` of `in` (vocab floats, unprocessed). Returns vocab probabilities
// summing to 1 (in double, rounded to float). *processed (optional) gets the processed logits
// (after penalties and biases, before temperature): what logprobs are computed from.
std::vector<float> TokenDistribution(const float* logits, int64_t vocab, const StepInputs& in,
                                     size_t row, std::vector<float>* processed = nullptr);

// Inverse CDF in ascending token-id order: the first token whose cumulative probability exceeds
// u * (total mass) for u in [0, 1); only tokens of positive probability are drawn.
int32_t DrawToken(const std::vector<float>& probs, double u);

}  // namespace tandem
