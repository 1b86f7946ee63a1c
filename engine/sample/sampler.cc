#include "engine/sample/sampler.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem {

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  auto bad = [](auto... args) { return absl::InvalidArgumentError(absl::StrFormat(args...)); };
  if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
    return bad("temperature must be >= 0, got %g", p.temperature);
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p must be in (0, 1], got %g", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p must be in [0, 1], got %g", p.min_p);
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.0f)) {
    return bad("repetition_penalty must be > 0, got %g", p.repetition_penalty);
  }
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) {
    return bad("frequency_penalty must be in [-2, 2], got %g", p.frequency_penalty);
  }
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) {
    return bad("presence_penalty must be in [-2, 2], got %g", p.presence_penalty);
  }
  if (p.max_tokens < 1) return bad("max_tokens must be >= 1, got %d", p.max_tokens);
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens) {
    return bad("min_tokens must be in [0, max_tokens = %d], got %d", p.max_tokens, p.min_tokens);
  }
  if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs) {
    return bad("logprobs must be in [0, %d], got %d", kMaxTopLogprobs, p.logprobs);
  }
  if (p.prompt_logprobs < -1 || p.prompt_logprobs > kMaxTopLogprobs) {
    return bad("prompt_logprobs must be in [0, %d], got %d", kMaxTopLogprobs, p.prompt_logprobs);
  }
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return bad("logit_bias has %d entries; at most %d", p.logit_bias.size(), kMaxLogitBias);
  }
  for (const auto& [token, bias] : p.logit_bias) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return bad("logit_bias of token %d must be in [-100, 100], got %g", token, bias);
    }
  }
  return absl::OkStatus();
}

uint64_t SeedFromRequestId(std::string_view id) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : id) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace tandem
