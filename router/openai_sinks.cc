#include "router/openai_sinks.h"

#include "router/api_error.h"

namespace tandem::router {

void SendError(HttpResponder& responder, RouterMetrics* metrics, const absl::Status& status,
               HttpHeaders extra_headers) {
  const int http_status = HttpStatusFor(status);
  if (http_status == 429 || http_status == 503) extra_headers.emplace_back("Retry-After", "1");
  if (metrics != nullptr) metrics->CountHttpResponse(http_status);
  responder.Send(http_status, "application/json", Dump(ErrorBody(status, http_status)),
                 std::move(extra_headers));
}

SseSink::SseSink(std::shared_ptr<HttpResponder> responder, ResponseMeta meta,
                 RouterMetrics* metrics, HttpHeaders extra_headers)
    : responder_(std::move(responder)),
      meta_(std::move(meta)),
      metrics_(metrics),
      extra_headers_(std::move(extra_headers)) {}

void SseSink::Open() {
  absl::MutexLock lock(&mu_);
  OpenLocked();
}

void SseSink::OpenLocked() {
  if (opened_) return;
  opened_ = true;
  metrics_->CountHttpResponse(200);
  HttpHeaders headers = extra_headers_;
  headers.emplace_back("Cache-Control", "no-cache");
  headers.emplace_back("X-Accel-Buffering", "no");
  responder_->StartStream(200, "text/event-stream; charset=utf-8", std::move(headers));
}

void SseSink::OnOutput(const std::vector<int32_t>& token_ids, const std::string& text) {
  absl::MutexLock lock(&mu_);
  OpenLocked();
  // The first token always makes a chunk (clients time TTFT by it); later ones only with text.
  if (sent_first_ && text.empty()) return;
  const bool with_role = !sent_first_;
  sent_first_ = true;
  responder_->Write(SseEvent(DeltaChunk(meta_, text, with_role)));
}

void SseSink::OnFinish(const FinishInfo& info) {
  absl::MutexLock lock(&mu_);
  OpenLocked();
  if (!sent_first_ && meta_.kind == ApiKind::kChat) {
    responder_->Write(SseEvent(DeltaChunk(meta_, "", /*with_role=*/true)));
  }
  sent_first_ = true;
  responder_->Write(SseEvent(FinishChunk(meta_, info.reason)));
  if (meta_.include_usage) responder_->Write(SseEvent(UsageChunk(meta_, info)));
  responder_->Write(kSseDone);
  responder_->EndStream();
}

void SseSink::OnError(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
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

BufferedSink::BufferedSink(std::shared_ptr<HttpResponder> responder, ResponseMeta meta,
                           RouterMetrics* metrics, HttpHeaders extra_headers)
    : responder_(std::move(responder)),
      meta_(std::move(meta)),
      metrics_(metrics),
      extra_headers_(std::move(extra_headers)) {}

void BufferedSink::OnOutput(const std::vector<int32_t>&, const std::string& text) { text_ += text; }

void BufferedSink::OnFinish(const FinishInfo& info) {
  metrics_->CountHttpResponse(200);
  responder_->Send(200, "application/json", Dump(FullResponse(meta_, text_, info)), extra_headers_);
}

void BufferedSink::OnError(const absl::Status& status) {
  SendError(*responder_, metrics_, status, extra_headers_);
}

}  // namespace tandem::router
