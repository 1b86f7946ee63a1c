// OpenAiApi: the router's HTTP endpoints on top of HttpServer.
//   POST /v1/completions, /v1/chat/completions   (stream and not; see openai_sinks.h)
//   GET  /v1/models, /v1/models/{id}, /version, /health, /ready, /metrics
//   POST /tokenize {"prompt" | "messages", "add_special_tokens"} →
//   {"count","max_model_len","tokens"} POST /detokenize {"tokens"} → {"prompt"}
// With an API key, /v1/*, /tokenize and /detokenize need "Authorization: Bearer <key>" (401
// otherwise); /health, /ready, /metrics and /version stay open (vLLM's convention). An
// "x-request-id" header is echoed back.
#pragma once

#include <memory>
#include <string>

#include "base/clock.h"
#include "router/generation_service.h"
#include "router/http_server.h"
#include "router/openai_request.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace tandem::router {

struct ApiOptions {
  std::string api_key;     // empty: no authentication
  std::string model_root;  // /v1/models "root" (the model directory)
  std::string version = "0.1.0";
  Clock* clock = Clock::Real();  // the responses' "created" times
};

class OpenAiApi {
 public:
  // Borrowed pointers must outlive the API object.
  OpenAiApi(ApiOptions options, ModelContext model, GenerationService* service,
            WorkerRegistry* registry, RouterMetrics* metrics);

  void Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder);
  // HttpHandler bound to this object.
  HttpHandler Handler();

 private:
  void HandleGenerate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                      ApiKind kind, HttpHeaders headers);
  void HandleTokenize(const HttpRequest& request, HttpResponder& responder,
                      const HttpHeaders& headers);
  void HandleDetokenize(const HttpRequest& request, HttpResponder& responder,
                        const HttpHeaders& headers);
  void HandleModels(HttpResponder& responder, const HttpHeaders& headers);
  // GET /v1/models/{id}: the model object, or 404 for another id.
  void HandleModel(const std::string& id, HttpResponder& responder, const HttpHeaders& headers);
  nlohmann::json ModelJson() const;
  void SendJson(HttpResponder& responder, int status, const nlohmann::json& body,
                const HttpHeaders& headers);
  bool Authorized(const HttpRequest& request) const;

  const ApiOptions options_;
  const ModelContext model_;
  GenerationService* service_;
  WorkerRegistry* registry_;
  RouterMetrics* metrics_;
  const int64_t created_;  // /v1/models "created"
};

}  // namespace tandem::router
