// The HTTP answer of one OpenAI generation request, whatever its number of choices (batched
// prompts, n, best_of): each sequence the request runs writes to its own GenerationSink
// (SinkFor), and OpenAiResponse turns their calls into the response.
//   Streaming:  per choice [role chunk with the first text] text chunks... finish chunk, each
//               with its "index"; once every choice finished, [usage chunk] data: [DONE]. An
//               error after the stream started goes in-band: data: {"error": ...} then [DONE].
//               The HTTP 200 and SSE headers go out when Open() is called or the first event
//               comes, whichever is first.
//   Buffered:   one JSON body once every sequence finished; with best_of > n, the n sequences
//               of each prompt with the highest cumulative logprob, best first.
// An error in one sequence fails the response and cancels the other sequences.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "router/generation_sink.h"
#include "router/http_server.h"
#include "router/openai_response.h"
#include "router/router_metrics.h"

namespace tandem::router {

// Sends an OpenAI error envelope (429 and 503 carry Retry-After) and counts the response.
void SendError(HttpResponder& responder, RouterMetrics* metrics, const absl::Status& status,
               HttpHeaders extra_headers = {});

// How a request's sequences map to choices: sequence s is prompt s / best_of, sample
// s % best_of.
struct ChoiceLayout {
  bool stream = false;
  int n = 1;
  int best_of = 1;                 // >= n; > n only when not streaming
  std::vector<int> prompt_tokens;  // per prompt
  std::vector<std::string> echo;   // per prompt: text before the output (empty: no echo)
  // Per prompt, with echo + logprobs or prompt_logprobs: its first token's text (which has no
  // logprob: it has no context).
  std::vector<std::string> first_prompt_token;
  bool rank_by_logprob = false;  // best_of > n: the sequences carry logprobs to rank them
  int num_sequences() const { return static_cast<int>(prompt_tokens.size()) * best_of; }
};

class OpenAiResponse : public std::enable_shared_from_this<OpenAiResponse> {
 public:
  // `run_soon` runs a callback on another thread soon (the cancellation of sibling sequences
  // must not run inside a sink call).
  OpenAiResponse(std::shared_ptr<HttpResponder> responder, ResponseMeta meta,
                 RouterMetrics* metrics, HttpHeaders extra_headers, ChoiceLayout layout,
                 std::function<void(std::function<void()>)> run_soon);

  std::shared_ptr<GenerationSink> SinkFor(int sequence);
  // The handles of the submitted sequences (to cancel them on an error or a disconnect).
  void AddHandle(std::shared_ptr<RequestHandle> handle);
  // Streaming: sends the 200 and SSE headers now.
  void Open();
  // A sequence could not be submitted: the response fails with `status`, the others are
  // cancelled.
  void Fail(const absl::Status& status);
  // The client went away: cancels every sequence.
  void CancelAll();

  void OnOutput(int sequence, const OutputDelta& delta);
  void OnFinish(int sequence, const FinishInfo& info);
  void OnError(int sequence, const absl::Status& status);

 private:
  struct Sequence {
    std::string text;
    std::vector<TokenLogprobInfo> logprobs;
    std::vector<TokenLogprobInfo> prompt_logprobs;  // OutputDelta::prompt_logprobs
    int64_t text_offset = 0;                        // completions: the next token's text_offset
    bool sent_first = false;
    bool finished = false;
    FinishInfo info;
  };

  void OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  UsageCounts UsageLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendWholeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  nlohmann::json LogprobsJsonLocked(Sequence& seq, const std::vector<TokenLogprobInfo>& lp)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<HttpResponder> responder_;
  const ResponseMeta meta_;
  RouterMetrics* metrics_;
  const HttpHeaders extra_headers_;
  const ChoiceLayout layout_;
  const std::function<void(std::function<void()>)> run_soon_;
  absl::Mutex mu_;
  std::vector<Sequence> sequences_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<RequestHandle>> handles_ ABSL_GUARDED_BY(mu_);
  int num_finished_ ABSL_GUARDED_BY(mu_) = 0;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;  // answered (or failed): later calls are dropped
};

}  // namespace tandem::router
