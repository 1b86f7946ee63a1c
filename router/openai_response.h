// JSON bodies of OpenAI-compatible responses: the error envelope, streaming chunks (SSE events)
// and whole (non-streaming) responses, for /v1/completions and /v1/chat/completions, with any
// number of choices.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "router/generate_spec.h"
#include "router/generation_sink.h"

namespace tandem::router {

// {"error": {"message", "type", "param", "code"}} with code = the HTTP status (vLLM style).
nlohmann::json ErrorBody(const absl::Status& status, int http_status);
// Serializes without ever throwing (invalid UTF-8 is replaced by U+FFFD).
std::string Dump(const nlohmann::json& value);
// One SSE event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& value);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// "stop", "length", "abort" (null for an unfinished choice).
nlohmann::json FinishReasonJson(tandem::v1::FinishReason reason);
// The matched stop string, the stop token id, or null (EOS, length, ...): vLLM's stop_reason.
nlohmann::json StopReasonJson(const FinishInfo& info);

struct UsageCounts {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};
// {"prompt_tokens", "completion_tokens", "total_tokens",
//  "prompt_tokens_details": {"cached_tokens"}}.
nlohmann::json UsageJson(const UsageCounts& usage);
// Per-request phase timings (a tandem extension to the OpenAI body, read by tandem-loadgen):
// tandem.v1.PhaseTimings with its proto field names, in seconds.
nlohmann::json TimingsJson(const tandem::v1::PhaseTimings& timings);

// Completions "logprobs" of `tokens`: {"tokens", "token_logprobs", "top_logprobs" (per token a
// {token text: logprob} object of the alternatives and the sampled token), "text_offset"}.
// `*text_offset` is the offset of the first token's text in the choice's text; it is advanced
// past these tokens (token texts concatenated, as vLLM counts them).
nlohmann::json CompletionLogprobsJson(const std::vector<TokenLogprobInfo>& tokens,
                                      int64_t* text_offset);
// Chat "logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
nlohmann::json ChatLogprobsJson(const std::vector<TokenLogprobInfo>& tokens);

// Identity shared by every chunk of one response.
struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  ApiKind kind = ApiKind::kCompletion;
  bool include_usage = false;     // streaming: "usage": null on every chunk, then a usage chunk
  bool continuous_usage = false;  // streaming: every chunk carries the usage so far
  bool logprobs = false;          // the request asked for logprobs
};

// A streamed chunk of choice `index` carrying `text` (chat: a content delta; `with_role` adds
// "role":"assistant") and its tokens' `logprobs` (null when not asked for).
nlohmann::json DeltaChunk(const ResponseMeta& meta, int index, const std::string& text,
                          bool with_role, const nlohmann::json& logprobs);
// The last chunk of choice `index`: empty delta / text, the finish and stop reasons.
nlohmann::json FinishChunk(const ResponseMeta& meta, int index, const FinishInfo& info);
// The usage chunk sent before [DONE] when stream_options.include_usage: "choices": [].
nlohmann::json UsageChunk(const ResponseMeta& meta, const UsageCounts& usage,
                          const tandem::v1::PhaseTimings& timings);

// One finished choice of a whole response.
struct ChoiceResult {
  int index = 0;
  std::string text;
  std::vector<TokenLogprobInfo> logprobs;
  int64_t first_text_offset = 0;  // completions: where the generated text starts (echo)
  FinishInfo info;
};
// A whole, non-streamed response.
nlohmann::json FullResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                            const UsageCounts& usage, const tandem::v1::PhaseTimings& timings);

}  // namespace tandem::router
