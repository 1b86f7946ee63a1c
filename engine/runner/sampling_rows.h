// The sampling rows of a step: a sequence's SamplingRow for its logits row — its parameters, its
// seed and step (the number of tokens it sampled before, so a request samples the same tokens
// whatever batch it runs in, and again after a preemption), the token history its penalties
// need and its logit biases (with -inf on EOS and stop ids before min_tokens).
#pragma once

#include <vector>

#include "engine/model/step_inputs.h"
#include "engine/sched/sequence.h"

namespace tandem {

// Appends `seq`'s logits row for this step to `in` (sampling, history_*, bias_*): `in` must have
// history_start and bias_start started (one 0 each) before the first row. EOS ids (unless
// ignore_eos) and stop token ids are banned with a -inf bias while the request has fewer than
// min_tokens output tokens.
// `num_spec` > 0: the row after the first num_spec of seq.spec_tokens (a verify step's row), as if
// they had been emitted: they join the history as output tokens and count for step and min_tokens.
void AppendSamplingRow(const Sequence& seq, const std::vector<int>& eos_token_ids, StepInputs* in,
                       int num_spec = 0);

}  // namespace tandem
