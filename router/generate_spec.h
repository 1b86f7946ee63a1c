// GenerateSpec: one validated, tokenized generation request, whichever front end (OpenAI HTTP or
// the gRPC Generation service) it came from. Everything downstream of validation (admission,
// routing, the worker calls, detokenization) works on this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem::router {

enum class ApiKind { kCompletion, kChat, kGrpc };

// Resolved sampling options (defaults applied, ranges checked). Mirrors worker.proto
// SamplingParams and engine/engine.h SamplingParams, but for `stop` and `skip_special_tokens`:
// the text is the router's (TextStream), the workers know tokens only.
struct SamplingSpec {
  float temperature = 1.0f;  // [0, 2]; 0 = greedy
  float top_p = 1.0f;        // (0, 1]
  int top_k = -1;            // <= 0: off
  std::optional<uint64_t> seed;
  int max_tokens = 16;  // >= 1, prompt + max_tokens <= max_model_len
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  float min_p = 0.0f;                                 // [0, 1]
  int min_tokens = 0;                                 // [0, max_tokens]
  float repetition_penalty = 1.0f;                    // > 0
  float frequency_penalty = 0.0f;                     // [-2, 2]
  float presence_penalty = 0.0f;                      // [-2, 2]
  std::vector<std::pair<int32_t, float>> logit_bias;  // ids in [0, vocab), bias in [-100, 100]
  bool include_stop_str_in_output = false;
  // -1: none; 0..20: per-token logprobs with that many top alternatives (completions
  // `logprobs`; chat `logprobs: true` + `top_logprobs`).
  int logprobs = -1;
  // -1: none; 0..20: what the workers compute for the prompt (worker.proto
  // SamplingParams.prompt_logprobs): the most alternatives either the `prompt_logprobs` field
  // (GenerateSpec::prompt_logprobs) or echo with logprobs asks for.
  int prompt_logprobs = -1;
};

struct GenerateSpec {
  std::string request_id;  // unique among live requests ("cmpl-..." / "chatcmpl-...")
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // served model name
  std::vector<int32_t> prompt_tokens;
  SamplingSpec sampling;
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
  bool continuous_usage_stats = false;  // stream_options.continuous_usage_stats
  bool echo = false;                    // completions: the prompt text precedes the output
  // vLLM's `prompt_logprobs` field: -1 none; 0..20 alternatives per prompt position (the
  // choice's "prompt_logprobs"; chat: the response's). Not with stream (as vLLM).
  int prompt_logprobs = -1;
  // Choices: `n` of each prompt returned, `best_of` (>= n) generated; with best_of > n the n
  // with the highest cumulative logprob are returned (not streamed).
  int n = 1;
  int best_of = 1;
  // Completions with a list of prompts: the rest of the batch (this spec's prompt_tokens is the
  // first). Choice i*n + j is prompt i, sequence j.
  std::vector<std::vector<int32_t>> more_prompts;
};

}  // namespace tandem::router
