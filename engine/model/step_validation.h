// Checks a StepInputs against the model and the KV layout before any kernel runs, so that bad
// input becomes InvalidArgument and never reaches a kernel's CHECK.
#pragma once

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/model/step_inputs.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// InvalidArgument when: vector sizes disagree with num_seqs/num_tokens; query_start is not a
// non-decreasing prefix sum ending at num_tokens; a token id is outside [0, vocab_size); a
// position is negative or not below max_position_embeddings; a slot is outside the pool; a
// sequence has more new tokens than seq_lens, or needs more pages than max_pages_per_seq; a
// block-table entry it uses is outside [0, num_pages); a logits row is outside [0, num_tokens);
// or `layout` does not match the model (layers, KV heads, head_dim, dtype F32/BF16).
absl::Status ValidateStep(const StepInputs& in, const ModelConfig& config, const KvLayout& layout);

// Checks the sampling half of a step: one SamplingRow per logits row with parameters in range
// (temperature >= 0, top_p in (0, 1], min_p in [0, 1], repetition_penalty > 0, finite
// penalties, num_logprobs in [-1, kMaxTopLogprobs]), history and bias lists that are prefix sums
// over their arrays with token ids in the vocabulary, and bias values that are finite or -inf.
// Then the prompt logprob rows (ValidatePromptLogprobRows).
absl::Status ValidateSampling(const StepInputs& in, const ModelConfig& config);
// prompt_logprob_rows ascending in [0, num_tokens), targets in the vocabulary, top in
// [0, kMaxTopLogprobs], the three of one length.
absl::Status ValidatePromptLogprobRows(const StepInputs& in, const ModelConfig& config);

}  // namespace tandem
