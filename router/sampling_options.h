// Sampling options: reading them from an OpenAI request body and range-checking them (shared by
// the HTTP and gRPC front ends so both reject the same things with the same words).
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"
#include "router/generate_spec.h"

namespace tandem::router {

inline constexpr int kMaxStopStrings = 16;
// Most logit_bias entries (engine/request.h kMaxLogitBias) and top logprobs (kMaxTopLogprobs).
inline constexpr int kMaxLogitBiasEntries = 1024;
inline constexpr int kMaxLogprobs = 20;
// Most sequences one request may generate (prompts x best_of).
inline constexpr int kMaxSequencesPerRequest = 64;

// Reads temperature, top_p, top_k, min_p, seed, stop, stop_token_ids, ignore_eos,
// skip_special_tokens, include_stop_str_in_output, presence / frequency / repetition penalties,
// logit_bias, min_tokens, logprobs (chat: logprobs + top_logprobs), prompt_logprobs, echo (with
// logprobs: the prompt scored too), n, best_of and
// max_tokens (chat: max_completion_tokens wins over max_tokens), and rejects with a 400 the
// OpenAI and vLLM fields tandem does not implement (tools, response_format other than text,
// suffix, guided decoding, beam search, ...). `*max_tokens` is left unset when
// the request names none. Ranges that need the vocabulary or max_tokens are ValidateSampling's.
absl::Status ParseSamplingOptions(const nlohmann::json& request, ApiKind kind, GenerateSpec* spec,
                                  std::optional<int64_t>* max_tokens);

// Range checks with vLLM's wording: temperature in [0, 2], top_p in (0, 1], top_k -1/0 or >= 1,
// min_p in [0, 1], penalties (presence / frequency in [-2, 2], repetition > 0), min_tokens in
// [0, max_tokens], logprobs in [-1, 20], at most kMaxStopStrings non-empty stop strings, stop
// token ids and logit_bias ids in [0, vocab_size), biases in [-100, 100] (at most 1024).
absl::Status ValidateSampling(const SamplingSpec& sampling, int vocab_size);

}  // namespace tandem::router
