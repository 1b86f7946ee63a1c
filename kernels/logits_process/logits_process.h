// In-place processing of rows of fp32 logits before sampling, with vLLM / OpenAI semantics. Per
// row r, in this order (the CPU reference defines the float operations; the CUDA kernel performs
// the same ones, so both give the same bits):
//   a. repetition penalty rp = repetition_penalty[r] (1 = off; the caller keeps it > 0): for every
//      DISTINCT token t of the row's history (prompt and output tokens),
//        logit[t] = logit[t] > 0 ? logit[t] / rp : logit[t] * rp
//      (Hugging Face RepetitionPenaltyLogitsProcessor, vLLM);
//   b. frequency penalty f and presence penalty p (0 = off; finite): for every distinct token t of
//      the row's OUTPUT tokens, with c >= 1 its number of occurrences there (an exact integer),
//        logit[t] = logit[t] - fma(f, float(c), p)          (OpenAI: f * c + p, one rounding)
//   c. bias: for each (token, value) pair of the row's list, in list order, logit[token] += value
//      (OpenAI logit_bias; the engine also forbids EOS / stop tokens before min_tokens with
//      value -inf). A token listed twice gets both values, added in list order.
// A token's three steps compose (a, then b, then c); tokens are independent of each other, so the
// result does not depend on the order in which a kernel visits them (deterministic).
//
// Lists. Row r's history is history_tokens[history_start[r] .. history_start[r + 1]); its first
// num_prompt_history[r] tokens (clamped to [0, length]) are prompt tokens, which count for the
// repetition penalty only; the rest are output tokens. Row r's bias pairs are
// (bias_tokens[j], bias_values[j]) for j in [bias_start[r], bias_start[r + 1]).
// Robustness (the engine validates requests earlier; these rules keep bad data from corrupting
// memory): a token id outside [0, vocab_size) in either list is skipped; a row whose end offset
// is below its start, or whose start is negative, has an empty list. The offsets must otherwise
// lie inside the flat arrays (the kernel cannot know their lengths), and a row has fewer than
// 2^30 output tokens (the kernel counts them in 30 bits).
// Rows with nothing to do (rp == 1 or no history, f == p == 0 or no output tokens, no bias) are
// left untouched; the CUDA kernel returns from them after reading their parameters.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

struct LogitsProcessArgs {
  float* logits = nullptr;  // [batch, vocab_size] fp32, row-major, processed in place
  int64_t batch = 0;
  int64_t vocab_size = 0;
  // [batch] each; null means "off" for every row (1 for the repetition penalty, 0 for the others).
  const float* repetition_penalty = nullptr;
  const float* frequency_penalty = nullptr;
  const float* presence_penalty = nullptr;
  // History: flat token ids, and [batch + 1] offsets into them; history_start null means no row
  // has a history (then history_tokens and num_prompt_history are not read).
  const int32_t* history_tokens = nullptr;
  const int32_t* history_start = nullptr;
  // [batch]: how many of each row's first history tokens are prompt tokens; null means 0 (every
  // history token is an output token).
  const int32_t* num_prompt_history = nullptr;
  // Bias: flat (token, value) pairs and [batch + 1] offsets; bias_start null means no bias.
  const int32_t* bias_tokens = nullptr;
  const float* bias_values = nullptr;
  const int32_t* bias_start = nullptr;
};

// InvalidArgument for a negative batch, a vocabulary outside [1, 2^31), or a pointer the set
// arrays need that is null (logits; history_tokens with history_start; bias_tokens and
// bias_values with bias_start). Reads no array.
absl::Status ValidateLogitsProcessArgs(const LogitsProcessArgs& args);

// The CPU reference (multi-threaded over rows). CHECK-fails on arguments that
// ValidateLogitsProcessArgs rejects (a caller's bug, not user input).
void LogitsProcessRef(const LogitsProcessArgs& args);

// CUDA (sm_90a): one CTA per row (kernels/logits_process/WORKLOG.md). Every pointer is device
// memory. Returns ValidateLogitsProcessArgs' error, or a launch error.
absl::Status LogitsProcess(const LogitsProcessArgs& args, cudaStream_t stream);

}  // namespace tandem
