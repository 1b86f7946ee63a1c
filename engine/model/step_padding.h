// Padding a step to the shape a CUDA graph was captured for (engine/model/llama_model_step.cc).
//
// Decode graphs pad inside the backend (Ops::BeginStep's pad_seqs: one-token sequences). Verify
// graphs (speculative decoding: every sequence samples each of its 1 + m new tokens) are padded
// here, on the host, backend-neutrally: dummy sequences are appended after the real ones, so the
// real sequences, their tokens and their logits rows (the first rows) are exactly those of the
// unpadded step; a dummy's tokens store nothing (slot -1), read only page 0 and are greedy rows
// that nobody reads back.
#pragma once

#include <cstdint>

#include "engine/model/step_inputs.h"

namespace tandem {

// True when every new token of every sequence of `in` is a logits row, in token order (decodes
// and speculative verify chunks; not a prefill chunk), and no sequence has more than
// `max_tokens_per_seq` new tokens.
bool IsVerifyShaped(const StepInputs& in, int max_tokens_per_seq);

// The page-table stride a padded step needs: the real one, or more for the longest dummy.
int PaddedPagesPerSeq(const StepInputs& in, int seqs, int64_t tokens, int page_size);

// `in` with seqs - in.num_seqs dummy sequences appended that hold tokens - in.num_tokens new
// tokens (the first dummy takes what the others, one token each, leave), every dummy token a
// greedy logits row, block tables at stride PaddedPagesPerSeq, and attention_by_prefill_kernel
// set. Needs in.num_seqs < seqs and tokens - in.num_tokens >= seqs - in.num_seqs (CHECKed).
StepInputs PadWithDummySequences(const StepInputs& in, int seqs, int64_t tokens, int page_size);

}  // namespace tandem
