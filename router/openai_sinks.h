// GenerationSinks that answer an OpenAI HTTP request: SseSink streams chunks as Server-Sent
// Events; BufferedSink collects the text and sends one JSON response at the end.
#pragma once

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "router/generation_sink.h"
#include "router/http_server.h"
#include "router/openai_response.h"
#include "router/router_metrics.h"

namespace tandem::router {

// Sends an OpenAI error envelope (429 and 503 carry Retry-After) and counts the response.
void SendError(HttpResponder& responder, RouterMetrics* metrics, const absl::Status& status,
               HttpHeaders extra_headers = {});

// Streams:  [role chunk with the first text]  text chunks...  finish chunk  [usage chunk]
// data: [DONE]. An error after the stream started goes in-band: data: {"error": ...} then
// [DONE]. The HTTP 200 and SSE headers go out when Open() is called or the first event comes,
// whichever is first.
class SseSink : public GenerationSink {
 public:
  SseSink(std::shared_ptr<HttpResponder> responder, ResponseMeta meta, RouterMetrics* metrics,
          HttpHeaders extra_headers);
  void Open();
  void OnOutput(const std::vector<int32_t>& token_ids, const std::string& text) override;
  void OnFinish(const FinishInfo& info) override;
  void OnError(const absl::Status& status) override;

 private:
  void OpenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<HttpResponder> responder_;
  const ResponseMeta meta_;
  RouterMetrics* metrics_;
  const HttpHeaders extra_headers_;
  absl::Mutex mu_;
  bool opened_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_first_ ABSL_GUARDED_BY(mu_) = false;
};

class BufferedSink : public GenerationSink {
 public:
  BufferedSink(std::shared_ptr<HttpResponder> responder, ResponseMeta meta, RouterMetrics* metrics,
               HttpHeaders extra_headers);
  void OnOutput(const std::vector<int32_t>& token_ids, const std::string& text) override;
  void OnFinish(const FinishInfo& info) override;
  void OnError(const absl::Status& status) override;

 private:
  std::shared_ptr<HttpResponder> responder_;
  const ResponseMeta meta_;
  RouterMetrics* metrics_;
  const HttpHeaders extra_headers_;
  std::string text_;  // sink calls are serialized (generation_sink.h): no lock needed
};

}  // namespace tandem::router
