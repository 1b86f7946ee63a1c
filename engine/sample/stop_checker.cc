#include "engine/sample/stop_checker.h"

#include <algorithm>
#include <utility>

namespace tandem {

StopChecker::StopChecker(std::vector<int> eos_token_ids)
    : eos_token_ids_(std::move(eos_token_ids)) {}

bool StopChecker::IsStopToken(const SamplingParams& params, int32_t token) const {
  const auto& ids = params.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), token) != ids.end()) return true;
  if (params.ignore_eos) return false;
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

FinishReason StopChecker::Check(const SamplingParams& params, int32_t token, int num_output_tokens,
                                int num_tokens, int max_model_len) const {
  if (IsStopToken(params, token)) return FinishReason::kStop;
  if (num_output_tokens >= params.max_tokens || num_tokens >= max_model_len) {
    return FinishReason::kLength;
  }
  return FinishReason::kNone;
}

}  // namespace tandem
