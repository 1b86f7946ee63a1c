// The request types the engine's parts share: what a caller asks for (EngineRequest and its
// SamplingParams) and what each Step() gives back for it (RequestOutput, FinishReason). Their own
// header so that the scheduler (engine/sched) and the sampler (engine/sample) can use them
// without the Engine that is built on top of both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 1.0f;      // 0: greedy
  int top_k = -1;                // <= 0: off
  float top_p = 1.0f;            // 1: off
  float min_p = 0.0f;            // 0: off; keeps tokens with p >= min_p * p(most likely)
  std::optional<uint64_t> seed;  // unset: derived from the request id
  int max_tokens = 16;           // new tokens to generate, >= 1
  int min_tokens = 0;            // EOS and stop token ids are banned until this many tokens
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // No stop strings: the engine knows tokens only. Text and stop strings are applied where text
  // is streamed (tokenizer/text_stream.h), which ends the request with Abort() on a
  // match.
  // Penalties (kernels/logits_process/logits_process.h): repetition over prompt and output
  // tokens (> 0, 1 = off), frequency and presence over output tokens (OpenAI, 0 = off).
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // OpenAI logit_bias: added to the token's logit before sampling (at most kMaxLogitBias).
  std::vector<std::pair<int32_t, float>> logit_bias;
  // -1: no logprobs; 0..kMaxTopLogprobs: each sampled token's logprob and that many of the most
  // likely alternatives (log-softmax of the logits after penalties and bias, before temperature).
  int logprobs = -1;
  // -1: none; 0..kMaxTopLogprobs: vLLM's prompt_logprobs — for each prompt token after the
  // first, its logprob given the tokens before it (log-softmax of the raw logits: no penalties,
  // bias or temperature) and that many most likely alternatives. Such a request never reuses a
  // cached prefix (a cached page has no logits; vLLM skips the cache too) and runs its prompt
  // steps without a CUDA graph; other requests are not affected.
  int prompt_logprobs = -1;
};

// Most logit_bias entries a request may carry.
inline constexpr int kMaxLogitBias = 1024;

// The logprob of one sampled token and its top alternatives (most likely first).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top;
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kPrefillDone, kError };
// "stop", "length", "abort", "prefill_done", "error" or "none": logs and metric labels.
const char* FinishReasonName(FinishReason reason);

// Another sequence of a request's prompt (OpenAI `n` / `best_of`): its own id and seed; every
// other sampling parameter is the request's.
struct SiblingRequest {
  std::string id;                // unique among live requests
  std::optional<uint64_t> seed;  // unset: derived from this id
};

struct EngineRequest {
  std::string id;  // unique among live requests
  std::vector<int32_t> prompt_tokens;
  SamplingParams sampling;
  // More sequences of the same prompt. The prompt's KV is computed once, by this request; when
  // it is, each sibling forks: its block table shares the request's full prompt pages (one more
  // reference each, engine/kv/block_allocator.h) up to the page holding the last prompt token,
  // and it recomputes only that last, partial page's tokens (1 to page_size of them) into a page
  // of its own, whose last logits row it samples with its own seed. From then on each sibling is
  // a request of its own (outputs, Abort, finishing; prefill_only applies to each); a shared page
  // goes back when its last holder ends. Should this request end before its prompt is computed
  // (aborted, failed), its waiting siblings compute the prompt themselves, as requests of their
  // own.
  std::vector<SiblingRequest> siblings;
  // Prefill worker: stop after the first token with kPrefillDone, keeping the pages. If that
  // token already ends the request (EOS, a stop token, max_tokens 1) it ends with that
  // reason instead and its pages are freed: there is nothing to transfer.
  bool prefill_only = false;
  // With prefill_only: keep the prompt's KV even when the first token ends the request (a decode
  // worker's siblings fork from it, disaggregated n / best_of). The request then ends with
  // kPrefillDone all the same, its own ending reported in RequestOutput::prefill_finish_reason.
  bool keep_kv_when_finished = false;
};

// What one Step() produced for one request.
struct RequestOutput {
  std::string id;
  std::vector<int32_t> new_tokens;  // tokens sampled this step (usually 0 or 1)
  // One per new token when the request asked for logprobs (SamplingParams::logprobs >= 0).
  std::vector<TokenLogprobs> logprobs;
  // SamplingParams::prompt_logprobs >= 0: on the output that carries the first token, one entry
  // per prompt token after the first (prompt_tokens[1..]), in order.
  std::vector<TokenLogprobs> prompt_logprobs;
  // Prompt tokens whose KV was found in a prefix cache instead of computed (0 without one);
  // reported on the output that carries the first token.
  int num_cached_tokens = 0;
  FinishReason finish_reason = FinishReason::kNone;  // kNone: still running
  // kPrefillDone of a keep_kv_when_finished request whose first token ended it: why (kStop or
  // kLength); kNone otherwise.
  FinishReason prefill_finish_reason = FinishReason::kNone;
  std::string error;  // set when finish_reason == kError
};

}  // namespace tandem
