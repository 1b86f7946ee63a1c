#include "router/openai_api.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "router/api_error.h"
#include "router/api_key.h"
#include "router/json_fields.h"
#include "router/openai_sinks.h"

namespace tandem::router {
namespace {

using nlohmann::json;

std::string RandomHex() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrFormat("%016x%016x", rng(), rng());
}

bool NeedsAuth(const std::string& path) {
  return absl::StartsWith(path, "/v1/") || path == "/tokenize" || path == "/detokenize";
}

}  // namespace

OpenAiApi::OpenAiApi(ApiOptions options, ModelContext model, GenerationService* service,
                     WorkerRegistry* registry, RouterMetrics* metrics)
    : options_(std::move(options)),
      model_(std::move(model)),
      service_(service),
      registry_(registry),
      metrics_(metrics),
      created_(absl::ToUnixSeconds(options_.clock->Now())) {}

HttpHandler OpenAiApi::Handler() {
  return [this](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    Handle(std::move(request), std::move(responder));
  };
}

bool OpenAiApi::Authorized(const HttpRequest& request) const {
  if (options_.api_key.empty() || !NeedsAuth(request.path)) return true;
  return ApiKeyMatches(request.Header("authorization"), options_.api_key);
}

void OpenAiApi::SendJson(HttpResponder& responder, int status, const json& body,
                         const HttpHeaders& headers) {
  metrics_->CountHttpResponse(status);
  responder.Send(status, "application/json", Dump(body), headers);
}

void OpenAiApi::Handle(HttpRequest request, std::shared_ptr<HttpResponder> responder) {
  HttpHeaders headers;
  if (std::string id = request.Header("x-request-id"); !id.empty()) {
    headers.emplace_back("x-request-id", id);
  }
  if (!Authorized(request)) {
    metrics_->CountRejected("unauthorized");
    return SendError(*responder, metrics_, absl::UnauthenticatedError("invalid or missing API key"),
                     headers);
  }
  const std::string& path = request.path;
  const bool post = request.method == "POST";
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (post && path == "/v1/completions") {
    return HandleGenerate(request, responder, ApiKind::kCompletion, headers);
  }
  if (post && path == "/v1/chat/completions") {
    return HandleGenerate(request, responder, ApiKind::kChat, headers);
  }
  if (post && path == "/tokenize") return HandleTokenize(request, *responder, headers);
  if (post && path == "/detokenize") return HandleDetokenize(request, *responder, headers);
  if (get && path == "/v1/models") return HandleModels(*responder, headers);
  if (get && absl::StartsWith(path, "/v1/models/")) {
    return HandleModel(path.substr(std::string_view("/v1/models/").size()), *responder, headers);
  }
  if (get && path == "/health") return SendJson(*responder, 200, {{"status", "ok"}}, headers);
  if (get && path == "/version") {
    return SendJson(*responder, 200, {{"version", options_.version}}, headers);
  }
  if (get && path == "/ready") {
    if (service_->HasUsableWorkers()) {
      return SendJson(*responder, 200, {{"status", "ready"}}, headers);
    }
    return SendError(*responder, metrics_,
                     absl::UnavailableError("no healthy worker is registered yet"), headers);
  }
  if (get && path == "/metrics") {
    service_->UpdateGauges();
    metrics_->CountHttpResponse(200);
    return responder->Send(200, "text/plain; version=0.0.4; charset=utf-8",
                           metrics_->Render(*registry_), headers);
  }
  static const char* kKnown[] = {"/v1/completions", "/v1/chat/completions",
                                 "/tokenize",       "/detokenize",
                                 "/v1/models",      "/health",
                                 "/version",        "/ready",
                                 "/metrics"};
  for (size_t i = 0; i < std::size(kKnown); ++i) {
    if (path == kKnown[i]) {
      metrics_->CountHttpResponse(405);
      headers.emplace_back("Allow", i < 4 ? "POST" : "GET, HEAD");  // the first four: POST
      json body = ErrorBody(absl::InvalidArgumentError(absl::StrCat("method ", request.method,
                                                                    " is not allowed on ", path)),
                            405);
      return responder->Send(405, "application/json", Dump(body), headers);
    }
  }
  SendError(*responder, metrics_, absl::NotFoundError(absl::StrCat("no route for ", path)),
            headers);
}

void OpenAiApi::HandleGenerate(const HttpRequest& request, std::shared_ptr<HttpResponder> responder,
                               ApiKind kind, HttpHeaders headers) {
  absl::StatusOr<GenerateSpec> spec = kind == ApiKind::kChat
                                          ? ParseChatRequest(request.body, model_)
                                          : ParseCompletionRequest(request.body, model_);
  if (!spec.ok()) {
    metrics_->CountRejected(HttpStatusFor(spec.status()) == 404 ? "unknown_model" : "invalid");
    return SendError(*responder, metrics_, spec.status(), headers);
  }
  ResponseMeta meta;
  meta.id = (kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + RandomHex();
  meta.created = absl::ToUnixSeconds(options_.clock->Now());
  meta.model = model_.served_name;
  meta.kind = kind;
  meta.include_usage = spec->stream && spec->include_usage;
  meta.continuous_usage = meta.include_usage && spec->continuous_usage_stats;
  meta.logprobs = spec->sampling.logprobs >= 0;
  meta.num_logprobs = spec->sampling.logprobs;
  meta.echo_logprobs = spec->echo && meta.logprobs;
  meta.prompt_logprobs = spec->prompt_logprobs;

  // One spec per sequence: every prompt of the batch, best_of times.
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(spec->prompt_tokens);
  for (std::vector<int32_t>& p : spec->more_prompts) prompts.push_back(std::move(p));
  spec->more_prompts.clear();
  ChoiceLayout layout;
  layout.stream = spec->stream;
  layout.n = spec->n;
  layout.best_of = spec->best_of;
  layout.rank_by_logprob = spec->best_of > spec->n;
  for (const std::vector<int32_t>& p : prompts) {
    layout.prompt_tokens.push_back(static_cast<int>(p.size()));
    layout.echo.push_back(spec->echo ? model_.tokenizer->Decode(p, /*skip_special_tokens=*/true)
                                     : std::string());
    // A token's own text, special tokens kept (as RequestFlow::LogprobOf writes the others).
    layout.first_prompt_token.push_back(
        p.empty() ? std::string()
                  : model_.tokenizer->Decode({p[0]}, /*skip_special_tokens=*/false));
  }
  // Ranking best_of sequences needs their logprobs, asked for or not (then not shown).
  if (layout.rank_by_logprob && spec->sampling.logprobs < 0) spec->sampling.logprobs = 0;
  auto response = std::make_shared<OpenAiResponse>(
      responder, meta, metrics_, headers, layout,
      [service = service_](std::function<void()> fn) { service->RunSoon(std::move(fn)); });
  // One request per prompt, its best_of sequences as siblings: the workers prefill the prompt
  // once and fork the samples from its KV (sample j samples with the request's seed + j).
  for (size_t p = 0; p < prompts.size(); ++p) {
    GenerateSpec one = *spec;
    one.prompt_tokens = std::move(prompts[p]);
    one.request_id = prompts.size() > 1 ? absl::StrCat(meta.id, "-", p) : meta.id;
    std::vector<std::shared_ptr<GenerationSink>> sinks;
    for (int j = 0; j < layout.best_of; ++j) {
      sinks.push_back(response->SinkFor(static_cast<int>(p) * layout.best_of + j));
    }
    absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
        service_->Submit(std::move(one), std::move(sinks));
    if (!handle.ok()) return response->Fail(handle.status());
    response->AddHandle(*std::move(handle));
  }
  responder->SetCancelCallback([response] { response->CancelAll(); });
}

}  // namespace tandem::router
