// JSON bodies of OpenAI-compatible responses: the error envelope, streaming chunks (SSE events)
// and whole (non-streaming) responses, for /v1/completions and /v1/chat/completions.
#pragma once

#include <cstdint>
#include <string>

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
nlohmann::json UsageJson(const FinishInfo& info);
// Per-request phase timings (a tandem extension to the OpenAI body, read by tandem-loadgen):
// tandem.v1.PhaseTimings with its proto field names, in seconds.
nlohmann::json TimingsJson(const tandem::v1::PhaseTimings& timings);

// Identity shared by every chunk of one response.
struct ResponseMeta {
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;
  std::string model;
  ApiKind kind = ApiKind::kCompletion;
  bool include_usage = false;  // streaming: "usage": null on every chunk, then a usage chunk
};

// A streamed chunk carrying `text` (chat: a content delta; `with_role` adds "role":"assistant").
nlohmann::json DeltaChunk(const ResponseMeta& meta, const std::string& text, bool with_role);
// The last choice-bearing chunk: empty delta / text and the finish reason.
nlohmann::json FinishChunk(const ResponseMeta& meta, tandem::v1::FinishReason reason);
// The usage chunk sent before [DONE] when stream_options.include_usage: "choices": [].
nlohmann::json UsageChunk(const ResponseMeta& meta, const FinishInfo& info);
// A whole, non-streamed response.
nlohmann::json FullResponse(const ResponseMeta& meta, const std::string& text,
                            const FinishInfo& info);

}  // namespace tandem::router
