// HttpTarget: the OpenAI HTTP API (/v1/completions or /v1/chat/completions) with streaming SSE
// and stream_options.include_usage, over Boost.Beast on one io_context (plain HTTP/1.1,
// keep-alive connections pooled and reused; a stale pooled connection is retried once).
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/bench_clock.h"
#include "loadgen/target.h"

namespace tandem::loadgen {

struct HttpTargetOptions {
  std::string base_url = "http://127.0.0.1:8000";  // http://host:port[/prefix]; no TLS
  std::string endpoint = "/v1/completions";
  bool chat = false;  // request body shape: messages (chat) or prompt (completions)
  std::string model;
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::string extra_body;            // JSON object merged into every request body
  std::vector<std::string> headers;  // extra "Name: value" headers
  std::string api_key;               // sent as "Authorization: Bearer <key>" when set
  bool keep_text = false;            // keep generated text in the record (--save-detailed)
  double request_timeout_s = 6 * 3600;
};

class HttpTarget : public Target {
 public:
  // Resolves the host once (blocking). `clock` must outlive the target.
  static absl::StatusOr<std::unique_ptr<HttpTarget>> Create(boost::asio::io_context& io,
                                                            const BenchClock* clock,
                                                            HttpTargetOptions options);
  ~HttpTarget() override;

  boost::asio::awaitable<void> Send(const RequestSpec& spec, RequestRecord* record) override;
  void CancelAll() override;

  struct Connection;
  struct Impl;

 private:
  explicit HttpTarget(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// GET {base_url}/v1/models and return the first model's id (blocking; used when --model is
// not given, as `vllm bench serve` does).
absl::StatusOr<std::string> FetchFirstModelId(const std::string& base_url);

// Builds the JSON body of one streaming request.
std::string BuildRequestBody(const HttpTargetOptions& options, const RequestSpec& spec);

}  // namespace tandem::loadgen
