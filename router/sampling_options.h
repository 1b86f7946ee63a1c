// Sampling options: reading them from an OpenAI request body and range-checking them (shared by
// the HTTP and gRPC front ends so both reject the same things with the same words).
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"
#include "router/generate_spec.h"

namespace tandem::router {

inline constexpr int kMaxStopStrings = 16;

// Reads temperature, top_p, top_k, seed, stop, stop_token_ids, ignore_eos, skip_special_tokens,
// max_tokens (chat: max_completion_tokens wins over max_tokens) and rejects unsupported options
// (n != 1, best_of > 1, logprobs, echo, suffix, min_tokens > 0). Also checks ranges.
// `*max_tokens` is left unset when the request names none.
absl::Status ParseSamplingOptions(const nlohmann::json& request, ApiKind kind,
                                  SamplingSpec* sampling, std::optional<int64_t>* max_tokens);

// Range checks with vLLM's wording: temperature in [0, 2], top_p in (0, 1], top_k -1/0 or >= 1,
// at most kMaxStopStrings non-empty stop strings, stop token ids in [0, vocab_size).
absl::Status ValidateSampling(const SamplingSpec& sampling, int vocab_size);

}  // namespace tandem::router
