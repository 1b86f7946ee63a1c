// StopChecker: the token-level stop conditions, applied to each sampled token in this order:
//   1. a token in stop_token_ids, or an EOS id (unless ignore_eos): finish kStop (the token is
//      part of the output);
//   2. max_tokens reached, or the sequence reached max_model_len: finish kLength.
// Stop strings are not here: the engine knows tokens only, and text is matched where it is
// streamed (tokenizer/text_stream.h explains why). Immutable: one per engine.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace tandem {

class StopChecker {
 public:
  explicit StopChecker(std::vector<int> eos_token_ids);

  // Whether `token`, just appended, ends the request. `num_output_tokens` counts it;
  // `num_tokens` is the sequence length (prompt + output) including it.
  FinishReason Check(const SamplingParams& params, int32_t token, int num_output_tokens,
                     int num_tokens, int max_model_len) const;

 private:
  bool IsStopToken(const SamplingParams& params, int32_t token) const;

  std::vector<int> eos_token_ids_;
};

}  // namespace tandem
