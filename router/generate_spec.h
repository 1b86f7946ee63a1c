// GenerateSpec: one validated, tokenized generation request, whichever front end (OpenAI HTTP or
// the gRPC Generation service) it came from. Everything downstream of validation (admission,
// routing, the worker calls, detokenization) works on this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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
};

struct GenerateSpec {
  std::string request_id;  // unique among live requests ("cmpl-..." / "chatcmpl-...")
  ApiKind kind = ApiKind::kCompletion;
  std::string model;  // served model name
  std::vector<int32_t> prompt_tokens;
  SamplingSpec sampling;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions `echo`-style extras are not supported; chat-only fields are already applied.
};

}  // namespace tandem::router
