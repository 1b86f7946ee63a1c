// GenerationSink: where a request's output goes (an HTTP response, a gRPC stream, a test).
//
// Contract: calls for one request are serialized (never concurrent) but may come from any
// thread; they must not block and must not call back into the request synchronously. After
// OnOutput zero or more times, exactly one of OnFinish / OnError ends the request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::router {

struct FinishInfo {
  tandem::v1::FinishReason reason = tandem::v1::FINISH_REASON_STOP;  // STOP, LENGTH or ABORT
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;  // of prompt_tokens, those a worker's prefix cache supplied
  tandem::v1::PhaseTimings timings;
};

class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // New tokens and the text they completed (whole code points; may be empty even with tokens,
  // and may be non-empty with no tokens when held-back text is flushed at the end).
  virtual void OnOutput(const std::vector<int32_t>& token_ids, const std::string& text) = 0;
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
