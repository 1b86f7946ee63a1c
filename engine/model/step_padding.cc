#include "engine/model/step_padding.h"

#include <algorithm>

#include "base/check.h"

namespace tandem {

bool IsVerifyShaped(const StepInputs& in, int max_tokens_per_seq) {
  if (in.num_seqs < 1 || in.logits_rows.size() != static_cast<size_t>(in.num_tokens) ||
      in.query_start.size() != static_cast<size_t>(in.num_seqs) + 1) {
    return false;
  }
  for (int s = 0; s < in.num_seqs; ++s) {
    if (in.query_start[s + 1] - in.query_start[s] > max_tokens_per_seq) return false;
  }
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    if (in.logits_rows[t] != t) return false;
  }
  return true;
}

namespace {

// The dummies' token counts: the first takes the excess, every other one token.
int64_t FirstDummyTokens(const StepInputs& in, int seqs, int64_t tokens) {
  return tokens - in.num_tokens - (seqs - in.num_seqs - 1);
}

}  // namespace

int PaddedPagesPerSeq(const StepInputs& in, int seqs, int64_t tokens, int page_size) {
  const int64_t longest = FirstDummyTokens(in, seqs, tokens);
  return std::max<int>(in.max_pages_per_seq,
                       static_cast<int>((longest + page_size - 1) / page_size));
}

StepInputs PadWithDummySequences(const StepInputs& in, int seqs, int64_t tokens, int page_size) {
  const int dummies = seqs - in.num_seqs;
  CHECK_GE(dummies, 1);
  CHECK_GE(tokens - in.num_tokens, dummies);
  StepInputs p = in;
  p.attention_by_prefill_kernel = true;
  p.max_pages_per_seq = PaddedPagesPerSeq(in, seqs, tokens, page_size);
  p.block_tables.assign(static_cast<size_t>(seqs) * p.max_pages_per_seq, 0);
  for (int s = 0; s < in.num_seqs; ++s) {
    std::copy_n(in.block_tables.begin() + static_cast<size_t>(s) * in.max_pages_per_seq,
                in.max_pages_per_seq,
                p.block_tables.begin() + static_cast<size_t>(s) * p.max_pages_per_seq);
  }
  const int32_t history_end = static_cast<int32_t>(in.history_tokens.size());
  const int32_t bias_end = static_cast<int32_t>(in.bias_tokens.size());
  if (p.history_start.empty()) p.history_start.assign(p.logits_rows.size() + 1, 0);
  if (p.bias_start.empty()) p.bias_start.assign(p.logits_rows.size() + 1, 0);
  p.num_prompt_history.resize(p.logits_rows.size(), 0);
  for (int d = 0; d < dummies; ++d) {
    const int64_t n = d == 0 ? FirstDummyTokens(in, seqs, tokens) : 1;
    for (int64_t i = 0; i < n; ++i) {
      p.logits_rows.push_back(static_cast<int32_t>(p.token_ids.size()));
      p.token_ids.push_back(0);
      p.positions.push_back(static_cast<int32_t>(i));
      p.slot_mapping.push_back(-1);
      p.sampling.push_back(SamplingRow{.temperature = 0.0f});
      p.history_start.push_back(history_end);  // empty lists
      p.bias_start.push_back(bias_end);
      p.num_prompt_history.push_back(0);
    }
    p.query_start.push_back(static_cast<int32_t>(p.token_ids.size()));
    p.seq_lens.push_back(static_cast<int32_t>(n));
  }
  p.num_seqs = seqs;
  p.num_tokens = static_cast<int64_t>(p.token_ids.size());
  CHECK_EQ(p.num_tokens, tokens);
  return p;
}

}  // namespace tandem
