#include "engine/sample/stop_checker.h"

#include <algorithm>

namespace tandem {
namespace {

// Length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t HoldBackLength(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const std::string& stop : stops) {
    const size_t max_len = std::min(text.size(), stop.size() - 1);
    for (size_t len = max_len; len > best; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        best = len;
        break;
      }
    }
  }
  return best;
}

}  // namespace

StopChecker::StopChecker(const SamplingParams& params, std::vector<int> eos_token_ids,
                         const Tokenizer* tokenizer)
    : params_(params), eos_token_ids_(std::move(eos_token_ids)) {
  if (tokenizer != nullptr) detokenizer_.emplace(tokenizer, /*skip_special_tokens=*/true);
}

bool StopChecker::IsStopToken(int32_t token) const {
  const auto& ids = params_.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), token) != ids.end()) return true;
  if (params_.ignore_eos) return false;
  return std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token) != eos_token_ids_.end();
}

std::string StopChecker::Scan(const std::string& delta, bool* matched) {
  held_ += delta;
  *matched = false;
  // Every occurrence of a stop string starts inside held_: the emitted text before it ended
  // with no prefix of any stop string.
  size_t first = std::string::npos;
  for (const std::string& stop : params_.stop) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    *matched = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  const size_t keep = HoldBackLength(held_, params_.stop);
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopChecker::FlushAll() {
  std::string out = std::move(held_);
  held_.clear();
  if (detokenizer_.has_value()) out += detokenizer_->Flush();
  return out;
}

StopChecker::Result StopChecker::Add(int32_t token, int num_output_tokens, int num_tokens,
                                     int max_model_len) {
  Result result;
  if (IsStopToken(token)) {
    result.text = FlushAll();
    result.finish_reason = FinishReason::kStop;
    return result;
  }
  if (detokenizer_.has_value()) {
    bool matched = false;
    result.text = Scan(detokenizer_->Add(token), &matched);
    if (matched) {
      result.finish_reason = FinishReason::kStop;
      return result;
    }
  }
  if (num_output_tokens >= params_.max_tokens || num_tokens >= max_model_len) {
    result.text += FlushAll();
    result.finish_reason = FinishReason::kLength;
  }
  return result;
}

std::string StopChecker::ReleaseHeldText() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

void StopChecker::Prime(int32_t token) {
  if (detokenizer_.has_value()) detokenizer_->Add(token);
}

}  // namespace tandem
