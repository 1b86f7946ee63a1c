// GenerationSink: where a request's output goes (an HTTP response, a gRPC stream, a test).
//
// Contract: calls for one request are serialized (never concurrent) but may come from any
// thread; they must not block and must not call back into the request synchronously. After
// OnOutput zero or more times, exactly one of OnFinish / OnError ends the request.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::router {

struct FinishInfo {
  tandem::v1::FinishReason reason = tandem::v1::FINISH_REASON_STOP;  // STOP, LENGTH or ABORT
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // prompt tokens the worker found in its prefix cache
  tandem::v1::PhaseTimings timings;
  // With reason STOP: the stop string that matched, or the stop token id (neither for EOS).
  std::string stop_string;
  std::optional<int32_t> stop_token_id;
};

// A token and its log-probability, with the token's own text (decoded alone, special tokens
// kept).
struct TokenLogprob {
  int32_t id = 0;
  std::string token;
  float logprob = 0.0f;
};

// One generated token's logprob and its most likely alternatives (most likely first).
struct TokenLogprobInfo {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;
};

struct OutputDelta {
  std::vector<int32_t> token_ids;
  // The text they completed (whole code points; may be empty even with tokens, and may be
  // non-empty with no tokens when held-back text is flushed at the end).
  std::string text;
  std::vector<TokenLogprobInfo> logprobs;  // one per token id when the request asked for them
  // On a sequence's first delta, when the request asked for prompt logprobs
  // (SamplingSpec::prompt_logprobs): one per prompt token after the first, `sampled` being that
  // prompt token, `top` its position's alternatives.
  std::optional<std::vector<TokenLogprobInfo>> prompt_logprobs;
};

class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  virtual void OnOutput(const OutputDelta& delta) = 0;
  virtual void OnFinish(const FinishInfo& info) = 0;
  // The request failed (Unavailable: a worker died; ResourceExhausted; Cancelled; ...).
  virtual void OnError(const absl::Status& status) = 0;
};

// Lets a front end cancel a submitted request (client disconnect): the workers are told to abort
// and the sink gets its terminal call (OnError with Cancelled) if it has not had one yet.
class RequestHandle {
 public:
  virtual ~RequestHandle() = default;
  virtual void Cancel() = 0;
};

}  // namespace tandem::router
