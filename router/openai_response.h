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

// The prompt's part of a completion's "logprobs" with echo (OpenAI's legacy format): the first
// prompt token (`first_token`, its text) with a null logprob and null top_logprobs, then one
// entry per `prompt` element (the prompt token after it) as CompletionLogprobsJson writes them,
// with at most `top` alternatives. Text offsets run over the tokens' texts from 0; `*text_offset`
// gets where the next (generated) token's starts (vLLM keeps one running offset over the prompt's
// and the output's tokens).
nlohmann::json EchoLogprobsJson(const std::string& first_token,
                                const std::vector<TokenLogprobInfo>& prompt, int top,
                                int64_t* text_offset);
// Appends `more`'s four arrays ("tokens", "token_logprobs", "top_logprobs", "text_offset") to
// `into`'s.
void AppendCompletionLogprobs(nlohmann::json& into, const nlohmann::json& more);
// vLLM's "prompt_logprobs" (vllm/entrypoints/openai/protocol.py: a list over the prompt's
// positions of null — the first, which has no context — or {token id: {"logprob", "rank",
// "decoded_token"}}): each position's prompt token and its `top` most likely alternatives.
// "rank" is 1-based among the alternatives the worker computed; a prompt token outside them has
// rank null (vLLM counts its rank over the whole vocabulary; the workers do not compute it).
nlohmann::json PromptLogprobsJson(const std::vector<TokenLogprobInfo>& prompt, int top);

// Identity shared by every chunk of one response.
struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  ApiKind kind = ApiKind::kCompletion;
  bool include_usage = false;     // streaming: "usage": null on every chunk, then a usage chunk
  bool continuous_usage = false;  // streaming: every chunk carries the usage so far
  bool logprobs = false;          // the request asked for logprobs
  int num_logprobs = -1;          // how many alternatives per token it asked for
  bool echo_logprobs = false;     // completions: echo with logprobs (the prompt's come first)
  int prompt_logprobs = -1;       // vLLM's prompt_logprobs field (-1: not asked)
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
  // ResponseMeta::echo_logprobs or prompt_logprobs: the prompt's first token's text and the
  // logprobs of the others (OutputDelta::prompt_logprobs).
  std::string first_prompt_token;
  std::vector<TokenLogprobInfo> prompt_logprobs;
};
// A whole, non-streamed response.
nlohmann::json FullResponse(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                            const UsageCounts& usage, const tandem::v1::PhaseTimings& timings);

}  // namespace tandem::router
