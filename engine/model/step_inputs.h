// StepInputs: everything one forward pass needs, the input of Model::Forward. The model runner
// (engine/runner) builds it once per step on the host from the scheduler's decision (plan once
// per step, run once per layer). Sequences are laid out back to back: sequence s owns query rows
// [query_start[s], query_start[s + 1]).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

struct StepInputs {
  int num_seqs = 0;
  int64_t num_tokens = 0;
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> positions;     // [num_tokens] absolute position of each token
  std::vector<int32_t> slot_mapping;  // [num_tokens] KV slot (page * page_size + offset)
  std::vector<int32_t> query_start;   // [num_seqs + 1] prefix sums of each sequence's new tokens
  std::vector<int32_t> seq_lens;      // [num_seqs] KV length after this step's tokens are stored
  int max_pages_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_pages_per_seq] page ids, padded with 0
  // Rows (indices into [0, num_tokens)) whose logits the step needs, in output order: usually
  // the last new token of each sequence that samples this step (a mid-prompt prefill chunk has
  // none).
  std::vector<int32_t> logits_rows;
};

}  // namespace tandem
