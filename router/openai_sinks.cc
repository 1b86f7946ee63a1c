#include "router/openai_sinks.h"

#include <algorithm>
#include <numeric>

#include "router/api_error.h"

namespace tandem::router {
namespace {

using nlohmann::json;

// One sequence's view of the response.
class SequenceSink : public GenerationSink {
 public:
  SequenceSink(std::shared_ptr<OpenAiResponse> response, int sequence)
      : response_(std::move(response)), sequence_(sequence) {}
  void OnOutput(const OutputDelta& delta) override { response_->OnOutput(sequence_, delta); }
  void OnFinish(const FinishInfo& info) override { response_->OnFinish(sequence_, info); }
  void OnError(const absl::Status& status) override { response_->OnError(sequence_, status); }

 private:
  const std::shared_ptr<OpenAiResponse> response_;
  const int sequence_;
};

double CumulativeLogprob(const std::vector<TokenLogprobInfo>& logprobs) {
  double sum = 0;
  for (const TokenLogprobInfo& t : logprobs) sum += t.sampled.logprob;
  return sum;
}

}  // namespace

void SendError(HttpResponder& responder, RouterMetrics* metrics, const absl::Status& status,
               HttpHeaders extra_headers) {
  const int http_status = HttpStatusFor(status);
  if (http_status == 429 || http_status == 503) extra_headers.emplace_back("Retry-After", "1");
  if (metrics != nullptr) metrics->CountHttpResponse(http_status);
  responder.Send(http_status, "application/json", Dump(ErrorBody(status, http_status)),
                 std::move(extra_headers));
}

OpenAiResponse::OpenAiResponse(std::shared_ptr<HttpResponder> responder, ResponseMeta meta,
                               RouterMetrics* metrics, HttpHeaders extra_headers,
                               ChoiceLayout layout,
                               std::function<void(std::function<void()>)> run_soon)
    : responder_(std::move(responder)),
      meta_(std::move(meta)),
      metrics_(metrics),
      extra_headers_(std::move(extra_headers)),
      layout_(std::move(layout)),
      run_soon_(std::move(run_soon)),
      sequences_(layout_.num_sequences()) {
  for (int s = 0; s < layout_.num_sequences(); ++s) {
    const std::string& echo = layout_.echo[s / layout_.best_of];
    sequences_[s].text_offset = static_cast<int64_t>(echo.size());
    if (!layout_.stream) sequences_[s].text = echo;
  }
}

std::shared_ptr<GenerationSink> OpenAiResponse::SinkFor(int sequence) {
  return std::make_shared<SequenceSink>(shared_from_this(), sequence);
}

void OpenAiResponse::AddHandle(std::shared_ptr<RequestHandle> handle) {
  absl::MutexLock lock(&mu_);
  handles_.push_back(std::move(handle));
}

void OpenAiResponse::Open() {
  absl::MutexLock lock(&mu_);
  if (layout_.stream) OpenLocked();
}

void OpenAiResponse::OpenLocked() {
  if (opened_) return;
  opened_ = true;
  metrics_->CountHttpResponse(200);
  HttpHeaders headers = extra_headers_;
  headers.emplace_back("Cache-Control", "no-cache");
  headers.emplace_back("X-Accel-Buffering", "no");
  responder_->StartStream(200, "text/event-stream; charset=utf-8", std::move(headers));
}

void OpenAiResponse::CancelAll() {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  {
    absl::MutexLock lock(&mu_);
    handles = handles_;
  }
  for (const auto& h : handles) h->Cancel();
}

void OpenAiResponse::Fail(const absl::Status& status) {
  std::vector<std::shared_ptr<RequestHandle>> handles;
  {
    absl::MutexLock lock(&mu_);
    FailLocked(status);
    handles = handles_;
  }
  for (const auto& h : handles) h->Cancel();
}

UsageCounts OpenAiResponse::UsageLocked() const {
  UsageCounts u;
  for (int p : layout_.prompt_tokens) u.prompt_tokens += p;
  for (size_t s = 0; s < sequences_.size(); ++s) {
    u.completion_tokens += sequences_[s].info.completion_tokens;
    // A prompt's cached tokens, counted once (its first sequence).
    if (s % layout_.best_of == 0) u.cached_tokens += sequences_[s].info.cached_tokens;
  }
  return u;
}

json OpenAiResponse::LogprobsJsonLocked(Sequence& seq, const std::vector<TokenLogprobInfo>& lp) {
  if (!meta_.logprobs) return nullptr;
  if (meta_.kind == ApiKind::kChat) return ChatLogprobsJson(lp);
  return CompletionLogprobsJson(lp, &seq.text_offset);
}

void OpenAiResponse::OnOutput(int s, const OutputDelta& delta) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  Sequence& seq = sequences_[s];
  // Completion tokens so far (continuous usage stats).
  seq.info.completion_tokens += static_cast<int>(delta.token_ids.size());
  if (delta.prompt_logprobs.has_value()) seq.prompt_logprobs = *delta.prompt_logprobs;
  if (!layout_.stream) {
    seq.text += delta.text;
    seq.logprobs.insert(seq.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
    return;
  }
  OpenLocked();
  // The first token always makes a chunk (clients time TTFT by it); later ones only with text
  // or logprobs.
  if (seq.sent_first && delta.text.empty() && (!meta_.logprobs || delta.logprobs.empty())) return;
  const bool with_role = !seq.sent_first;
  std::string text = delta.text;
  json echo_logprobs;
  if (!seq.sent_first) {
    text = layout_.echo[s / layout_.best_of] + text;
    if (meta_.echo_logprobs) {
      // The echoed prompt's tokens and logprobs lead the first chunk's (vLLM streams them so).
      echo_logprobs = EchoLogprobsJson(layout_.first_prompt_token[s / layout_.best_of],
                                       seq.prompt_logprobs, meta_.num_logprobs, &seq.text_offset);
    }
  }
  json logprobs = LogprobsJsonLocked(seq, delta.logprobs);
  if (!echo_logprobs.is_null()) {
    AppendCompletionLogprobs(echo_logprobs, logprobs);
    logprobs = std::move(echo_logprobs);
  }
  seq.sent_first = true;
  json chunk = DeltaChunk(meta_, s, text, with_role, logprobs);
  if (meta_.continuous_usage) chunk["usage"] = UsageJson(UsageLocked());
  responder_->Write(SseEvent(chunk));
}

void OpenAiResponse::OnFinish(int s, const FinishInfo& info) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  Sequence& seq = sequences_[s];
  if (seq.finished) return;
  seq.finished = true;
  seq.info = info;
  ++num_finished_;
  if (!layout_.stream) {
    if (num_finished_ == static_cast<int>(sequences_.size())) SendWholeLocked();
    return;
  }
  OpenLocked();
  if (!seq.sent_first &&
      (meta_.kind == ApiKind::kChat || !layout_.echo[s / layout_.best_of].empty())) {
    responder_->Write(SseEvent(DeltaChunk(meta_, s, layout_.echo[s / layout_.best_of],
                                          /*with_role=*/true, nullptr)));
  }
  seq.sent_first = true;
  json chunk = FinishChunk(meta_, s, info);
  if (meta_.continuous_usage) chunk["usage"] = UsageJson(UsageLocked());
  responder_->Write(SseEvent(chunk));
  if (num_finished_ < static_cast<int>(sequences_.size())) return;
  done_ = true;
  if (meta_.include_usage) {
    responder_->Write(SseEvent(UsageChunk(meta_, UsageLocked(), sequences_[0].info.timings)));
  }
  responder_->Write(kSseDone);
  responder_->EndStream();
}

void OpenAiResponse::SendWholeLocked() {
  done_ = true;
  std::vector<ChoiceResult> choices;
  const int num_prompts = static_cast<int>(layout_.prompt_tokens.size());
  for (int p = 0; p < num_prompts; ++p) {
    std::vector<int> order(layout_.best_of);
    std::iota(order.begin(), order.end(), p * layout_.best_of);
    if (layout_.best_of > layout_.n) {
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return CumulativeLogprob(sequences_[a].logprobs) >
               CumulativeLogprob(sequences_[b].logprobs);
      });
    }
    for (int j = 0; j < layout_.n; ++j) {
      Sequence& seq = sequences_[order[j]];
      ChoiceResult c;
      c.index = p * layout_.n + j;
      c.text = std::move(seq.text);
      c.logprobs = std::move(seq.logprobs);
      c.first_text_offset = static_cast<int64_t>(layout_.echo[p].size());
      if (!layout_.first_prompt_token.empty()) c.first_prompt_token = layout_.first_prompt_token[p];
      c.prompt_logprobs = std::move(seq.prompt_logprobs);
      c.info = seq.info;
      choices.push_back(std::move(c));
    }
  }
  metrics_->CountHttpResponse(200);
  responder_->Send(200, "application/json",
                   Dump(FullResponse(meta_, choices, UsageLocked(), sequences_[0].info.timings)),
                   extra_headers_);
}

void OpenAiResponse::FailLocked(const absl::Status& status) {
  if (done_) return;
  done_ = true;
  if (!opened_) {
    // Nothing sent yet: a proper HTTP error.
    opened_ = true;
    SendError(*responder_, metrics_, status, extra_headers_);
    return;
  }
  if (status.code() != absl::StatusCode::kCancelled) {
    responder_->Write(SseEvent(ErrorBody(status, HttpStatusFor(status))));
    responder_->Write(kSseDone);
  }
  responder_->EndStream();
}

void OpenAiResponse::OnError(int, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  FailLocked(status);
  if (sequences_.size() > 1) {
    // Inside a sink call of one sequence: the others are cancelled from another thread.
    run_soon_([handles = handles_] {
      for (const auto& h : handles) h->Cancel();
    });
  }
}

}  // namespace tandem::router
