// The request types the engine's parts share: what a caller asks for (EngineRequest and its
// SamplingParams) and what each Step() gives back for it (RequestOutput, FinishReason). Their own
// header so that the scheduler (engine/sched) and the sampler (engine/sample) can use them
// without the Engine that is built on top of both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;      // 0: greedy
  int top_k = -1;                // <= 0: off
  float top_p = 1.0f;            // 1: off
  std::optional<uint64_t> seed;  // unset: derived from the request id
  int max_tokens = 16;           // new tokens to generate, >= 1
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // No stop strings: the engine knows tokens only. Text and stop strings are applied where text
  // is streamed (tokenizer/text_stream.h), which ends the request with Abort() on a
  // match.
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kPrefillDone, kError };
// "stop", "length", "abort", "prefill_done", "error" or "none": logs and metric labels.
const char* FinishReasonName(FinishReason reason);

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  // Prefill worker: stop after the first token with kPrefillDone, keeping the pages. If that
  // token already ends the request (EOS, a stop token, max_tokens 1) it ends with that
  // reason instead and its pages are freed: there is nothing to transfer.
  bool prefill_only = false;
};

// What one Step() produced for one request.
struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_tokens;                   // tokens sampled this step (usually 0 or 1)
  FinishReason finish_reason = FinishReason::kNone;  // kNone: still running
  std::string error;                                 // set when finish_reason == kError
};

}  // namespace tandem
