// StepInputs: everything one step needs — the forward pass's index arrays and the sampling of
// each logits row — the input of Model::Step. The model runner (engine/runner) builds it once per
// step on the host from the scheduler's decision (plan once per step, run once per layer).
// Sequences are laid out back to back: sequence s owns query rows [query_start[s],
// query_start[s + 1]). StepOutput is what comes back: sampled token ids (and logprobs where a
// row asked), never the logits.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/logprobs/logprobs.h"  // kMaxTopLogprobs: most alternatives a row may ask for

namespace tandem {

// How one logits row is sampled. Semantics: kernels/logits_process/logits_process.h (penalties
// and bias, applied to the logits first), kernels/logprobs/logprobs.h (logprobs of the processed
// logits, before temperature), kernels/sampling/sampling.h (temperature, top-k, top-p, min_p).
struct SamplingRow {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = -1;        // <= 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint64_t seed = 0;
  uint64_t step = 0;                // tokens the request sampled before this one
  float repetition_penalty = 1.0f;  // 1: off
  float frequency_penalty = 0.0f;   // 0: off
  float presence_penalty = 0.0f;    // 0: off
  // -1: no logprobs; 0..kMaxTopLogprobs: the sampled token's logprob and that many alternatives.
  int32_t num_logprobs = -1;

  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
};

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

  // --- sampling, one entry per logits row ---
  std::vector<SamplingRow> sampling;  // [logits_rows.size()]
  // Token histories for the penalties of the rows that have any (empty ranges elsewhere): row r
  // owns history_tokens[history_start[r], history_start[r + 1]), its first num_prompt_history[r]
  // being prompt tokens (repetition penalty only), the rest its output tokens.
  std::vector<int32_t> history_tokens;
  std::vector<int32_t> history_start;       // [rows + 1]
  std::vector<int32_t> num_prompt_history;  // [rows]
  // Additive logit biases (OpenAI logit_bias, and -inf on EOS / stop tokens before min_tokens):
  // row r's are bias_tokens / bias_values [bias_start[r], bias_start[r + 1]).
  std::vector<int32_t> bias_tokens;
  std::vector<float> bias_values;
  std::vector<int32_t> bias_start;  // [rows + 1]

  // --- prompt logprobs (SamplingParams::prompt_logprobs; empty unless a request asks) ---
  // Row prompt_logprob_rows[i] (an index into [0, num_tokens): a prompt position p) scores the
  // prompt token after it, prompt_logprob_targets[i] (the token at p + 1): its logprob under the
  // log-softmax of row p's raw logits (no penalties, bias or temperature: vLLM's prompt
  // logprobs) and the row's prompt_logprob_top[i] in [0, kMaxTopLogprobs] most likely tokens.
  // Ascending rows; independent of logits_rows (a row may be in both).
  std::vector<int32_t> prompt_logprob_rows;
  std::vector<int32_t> prompt_logprob_targets;
  std::vector<int32_t> prompt_logprob_top;

  // The CUDA backend runs the attention of the leading sequences with exactly one new token
  // (decodes) with the decode kernel and the rest with the prefill kernel; set, every sequence
  // goes through the prefill kernel (a verify graph's steps: engine/model/step_padding.h).
  bool attention_by_prefill_kernel = false;

  // Leading sequences with exactly one new token (decodes).
  int NumLeadingSingleTokenSeqs() const {
    int n = 0;
    const int seqs = std::min<int>(num_seqs, static_cast<int>(query_start.size()) - 1);
    while (n < seqs && query_start[n + 1] - query_start[n] == 1) ++n;
    return n;
  }
  bool AnyLogprobs() const {
    for (const SamplingRow& r : sampling) {
      if (r.num_logprobs >= 0) return true;
    }
    return false;
  }
};

// What one step produced: per logits row, the sampled token and (rows with num_logprobs >= 0)
// its logprob and the top alternatives, best first.
struct StepOutput {
  std::vector<int32_t> tokens;  // [rows]
  // Filled only when some row asked for logprobs (else empty):
  std::vector<float> token_logprobs;  // [rows]
  std::vector<int32_t> top_tokens;    // [rows, kMaxTopLogprobs]; row r's first num_logprobs
  std::vector<float> top_logprobs;    // [rows, kMaxTopLogprobs]
  // Per prompt_logprob_rows entry (empty when the step has none): the target's logprob and the
  // top alternatives, best first, laid out as token_logprobs / top_tokens / top_logprobs.
  std::vector<float> prompt_token_logprobs;  // [prompt rows]
  std::vector<int32_t> prompt_top_tokens;    // [prompt rows, kMaxTopLogprobs]
  std::vector<float> prompt_top_logprobs;    // [prompt rows, kMaxTopLogprobs]
  // How long the host blocked waiting for the backend to finish the step (its device time not
  // overlapped with host work; 0 on the CPU backend, which computes synchronously).
  int64_t device_wait_ns = 0;
  bool graph_replayed = false;  // the step ran as a CUDA graph replay
};

}  // namespace tandem
