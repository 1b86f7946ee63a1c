// The engine's side of sampling a request: its parameters checked, and its seed. The rows a
// step samples are built by the runner (engine/runner/sampling_rows.h) and sampled on the backend
// (engine/model/device_sampler.h).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/request.h"

namespace tandem {

// InvalidArgument naming the field: temperature < 0 or not finite, top_p outside (0, 1], min_p
// outside [0, 1], repetition_penalty <= 0, frequency/presence penalties outside [-2, 2],
// max_tokens < 1, min_tokens outside [0, max_tokens], logprobs outside [-1, kMaxTopLogprobs],
// more than kMaxLogitBias biases or one outside [-100, 100]. Token ids (logit_bias keys,
// stop_token_ids) are checked against the vocabulary by the engine.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// The seed of a request without an explicit one: a stable hash of its id.
uint64_t SeedFromRequestId(std::string_view id);

}  // namespace tandem
