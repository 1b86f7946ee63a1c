// Interprets one SSE data payload of an OpenAI-compatible stream (/v1/completions or
// /v1/chat/completions). Which chunks count as a token is the contract behind TTFT and ITL:
//   - a chunk counts when `choices` is a non-empty array and choices[0] carries a token:
//     completions: any `text` (even "": a token that ended mid UTF-8 character);
//     chat: `delta.content` or `delta.reasoning_content` present and not null;
//   - not counted: a chat delta with only `role` (the preamble some servers send before
//     prefill finishes), a bare finish chunk (empty text and a finish_reason), usage-only chunks.
// `vllm bench serve` counts every chunk with non-empty choices; the two rules agree on servers
// that put the role and the finish reason on token chunks (vLLM, tandem).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "loadgen/request_record.h"

namespace tandem::loadgen {

struct ChunkInfo {
  bool done = false;                 // the "[DONE]" sentinel
  bool is_token = false;             // counts as a token chunk (see above)
  std::string text;                  // the token text (only filled when asked for)
  int prompt_tokens = -1;            // usage.prompt_tokens when this chunk carries usage
  int completion_tokens = -1;        // usage.completion_tokens when this chunk carries usage
  std::optional<std::string> error;  // in-stream error event: its message
  std::optional<ServerTiming> server_timing;
};

// Parses `payload`. Malformed JSON yields an error ChunkInfo (the stream is then failed).
ChunkInfo ParseChunk(std::string_view payload, bool want_text);

}  // namespace tandem::loadgen
