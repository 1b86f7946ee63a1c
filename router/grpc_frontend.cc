#include "router/grpc_frontend.h"

#include <algorithm>
#include <atomic>
#include <deque>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "router/api_error.h"
#include "router/registry_service.h"
#include "router/sampling_options.h"

namespace tandem::router {
namespace {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateResponse;

absl::Status SamplingFromProto(const tandem::v1::SamplingOptions& o, SamplingSpec* s) {
  if (o.has_temperature()) s->temperature = o.temperature();
  if (o.has_top_p()) s->top_p = o.top_p();
  if (o.has_top_k()) s->top_k = o.top_k();
  if (o.has_seed() && o.seed() != -1) s->seed = static_cast<uint64_t>(o.seed());
  s->stop.assign(o.stop().begin(), o.stop().end());
  s->stop_token_ids.assign(o.stop_token_ids().begin(), o.stop_token_ids().end());
  s->ignore_eos = o.ignore_eos();
  s->skip_special_tokens = !o.has_skip_special_tokens() || o.skip_special_tokens();
  if (o.has_min_p()) s->min_p = o.min_p();
  if (o.has_min_tokens()) s->min_tokens = o.min_tokens();
  if (o.has_repetition_penalty()) s->repetition_penalty = o.repetition_penalty();
  if (o.has_frequency_penalty()) s->frequency_penalty = o.frequency_penalty();
  if (o.has_presence_penalty()) s->presence_penalty = o.presence_penalty();
  if (o.logit_bias_size() > kMaxLogitBiasEntries) {
    return InvalidParam("logit_bias",
                        absl::StrCat("at most ", kMaxLogitBiasEntries, " logit_bias entries"));
  }
  s->logit_bias.assign(o.logit_bias().begin(), o.logit_bias().end());
  std::sort(s->logit_bias.begin(), s->logit_bias.end());
  s->include_stop_str_in_output = o.include_stop_str_in_output();
  if (o.has_logprobs()) {
    if (o.logprobs() < 0) return InvalidParam("logprobs", "logprobs must be in [0, 20]");
    s->logprobs = o.logprobs();
  }
  return absl::OkStatus();
}

// The stream of one Generate call, and the sink its request writes to. Owned by itself until
// gRPC calls OnDone, and by the request flow while it runs.
class GenerateReactor : public grpc::ServerWriteReactor<GenerateResponse>,
                        public GenerationSink,
                        public std::enable_shared_from_this<GenerateReactor> {
 public:
  explicit GenerateReactor(std::string request_id) : request_id_(std::move(request_id)) {}

  void Begin(std::shared_ptr<GenerateReactor> self) { self_ = std::move(self); }
  void SetHandle(std::shared_ptr<RequestHandle> handle) {
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      handle_ = handle;
      cancelled = cancelled_;
    }
    if (cancelled) handle->Cancel();
  }
  void FinishWith(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    final_status_ = ToGrpc(status);
    finishing_ = true;
    MaybeFinishLocked();
  }

  void OnOutput(const OutputDelta& delta) override {
    GenerateResponse response;
    response.set_request_id(request_id_);
    response.mutable_token_ids()->Add(delta.token_ids.begin(), delta.token_ids.end());
    response.set_text(delta.text);
    for (const TokenLogprobInfo& info : delta.logprobs) {
      tandem::v1::TokenLogprobs* lp = response.add_logprobs();
      lp->set_logprob(info.sampled.logprob);
      for (const TokenLogprob& top : info.top) {
        tandem::v1::TopLogprob* t = lp->add_top();
        t->set_token_id(top.id);
        t->set_logprob(top.logprob);
      }
    }
    Enqueue(std::move(response), false, grpc::Status::OK);
  }
  void OnFinish(const FinishInfo& info) override {
    GenerateResponse response;
    response.set_request_id(request_id_);
    response.set_finish_reason(info.reason);
    response.mutable_usage()->set_prompt_tokens(info.prompt_tokens);
    response.mutable_usage()->set_completion_tokens(info.completion_tokens);
    response.mutable_usage()->set_total_tokens(info.prompt_tokens + info.completion_tokens);
    response.mutable_usage()->set_cached_tokens(info.cached_tokens);
    if (!info.stop_string.empty()) {
      response.set_stop_string(info.stop_string);
    } else if (info.stop_token_id) {
      response.set_stop_token_id(*info.stop_token_id);
    }
    *response.mutable_timings() = info.timings;
    Enqueue(std::move(response), true, grpc::Status::OK);
  }
  void OnError(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    final_status_ = ToGrpc(status);
    finishing_ = true;
    MaybeFinishLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The client is gone. OnDone comes only after Finish, so finish now if the request has
      // already ended; otherwise OnCancel cancels the flow, whose OnError finishes the call.
      queue_.clear();
      MaybeFinishLocked();
      return;
    }
    queue_.pop_front();
    WriteNextLocked();
    MaybeFinishLocked();
  }
  void OnCancel() override {
    std::shared_ptr<RequestHandle> handle;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      handle = handle_;
    }
    if (handle) handle->Cancel();
  }
  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      handle_.reset();
    }
    self_.reset();  // may delete this
  }

 private:
  void Enqueue(GenerateResponse response, bool last, grpc::Status status) {
    absl::MutexLock lock(&mu_);
    if (done_ || finishing_) return;
    queue_.push_back(std::move(response));
    if (last) {
      finishing_ = true;
      final_status_ = status;
    }
    WriteNextLocked();
  }
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || queue_.empty() || done_) return;
    writing_ = true;
    StartWrite(&queue_.front());
  }
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finishing_ || finished_ || writing_ || !queue_.empty() || done_) return;
    finished_ = true;
    Finish(final_status_);
  }

  const std::string request_id_;
  std::shared_ptr<GenerateReactor> self_;
  absl::Mutex mu_;
  std::deque<GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);  // front is being written
  std::shared_ptr<RequestHandle> handle_ ABSL_GUARDED_BY(mu_);
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finishing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<GenerateSpec> SpecFromProto(const GenerateRequest& request,
                                           const ModelContext& model) {
  if (!request.model().empty() && request.model() != model.served_name) {
    return WithParam(
        absl::NotFoundError(absl::StrCat("The model `", request.model(), "` does not exist.")),
        "model");
  }
  GenerateSpec spec;
  spec.kind = ApiKind::kGrpc;
  spec.model = model.served_name;
  spec.request_id = request.request_id();
  spec.stream = true;
  int default_max_tokens = kDefaultCompletionMaxTokens;
  const bool add_special = !request.has_add_special_tokens() || request.add_special_tokens();
  switch (request.input_case()) {
    case GenerateRequest::kPrompt:
      if (!IsValidUtf8(request.prompt())) return InvalidParam("prompt", "prompt is not UTF-8");
      spec.prompt_tokens = model.tokenizer->Encode(request.prompt(), add_special);
      break;
    case GenerateRequest::kPromptTokens:
      for (int32_t id : request.prompt_tokens().ids()) {
        if (id < 0 || id >= model.vocab_size) {
          return InvalidParam("prompt_tokens", absl::StrCat("token id ", id, " is out of range"));
        }
        spec.prompt_tokens.push_back(id);
      }
      break;
    case GenerateRequest::kMessages: {
      std::vector<ChatMessage> messages;
      for (const auto& m : request.messages().messages()) {
        messages.push_back(ChatMessage{m.role(), m.content()});
      }
      if (messages.empty()) return InvalidParam("messages", "'messages' must not be empty");
      ASSIGN_OR_RETURN(std::string prompt, model.chat_formatter(messages));
      spec.prompt_tokens = model.tokenizer->Encode(prompt, /*add_special_tokens=*/false);
      default_max_tokens = -1;
      break;
    }
    default:
      return InvalidParam("input", "one of prompt, prompt_tokens or messages is required");
  }
  RETURN_IF_ERROR(SamplingFromProto(request.sampling(), &spec.sampling));
  std::optional<int64_t> max_tokens;
  if (request.sampling().has_max_tokens()) max_tokens = request.sampling().max_tokens();
  RETURN_IF_ERROR(ResolveMaxTokens(model, max_tokens, default_max_tokens, &spec));
  RETURN_IF_ERROR(ValidateSampling(spec.sampling, model.vocab_size));
  return spec;
}

GenerationGrpcService::GenerationGrpcService(ModelContext model, GenerationService* service,
                                             std::string api_key)
    : model_(std::move(model)), service_(service), api_key_(std::move(api_key)) {}

bool GenerationGrpcService::Authorized(const grpc::CallbackServerContext& context) const {
  if (api_key_.empty()) return true;
  auto it = context.client_metadata().find("authorization");
  if (it == context.client_metadata().end()) return false;
  return std::string(it->second.data(), it->second.size()) == "Bearer " + api_key_;
}

grpc::ServerWriteReactor<GenerateResponse>* GenerationGrpcService::Generate(
    grpc::CallbackServerContext* context, const GenerateRequest* request) {
  auto reactor = std::make_shared<GenerateReactor>(request->request_id());
  reactor->Begin(reactor);
  absl::StatusOr<GenerateSpec> spec =
      Authorized(*context)
          ? SpecFromProto(*request, model_)
          : absl::StatusOr<GenerateSpec>(absl::UnauthenticatedError("invalid or missing API key"));
  if (!spec.ok()) {
    reactor->FinishWith(spec.status());
    return reactor.get();
  }
  absl::StatusOr<std::shared_ptr<RequestHandle>> handle =
      service_->Submit(*std::move(spec), reactor);
  if (!handle.ok()) {
    reactor->FinishWith(handle.status());
  } else {
    reactor->SetHandle(*handle);
  }
  return reactor.get();
}

grpc::ServerUnaryReactor* GenerationGrpcService::ListModels(
    grpc::CallbackServerContext* context, const tandem::v1::ListModelsRequest*,
    tandem::v1::ListModelsResponse* response) {
  tandem::v1::ModelInfo* info = response->add_models();
  info->set_id(model_.served_name);
  info->set_max_model_len(model_.max_model_len);
  info->set_vocab_size(model_.vocab_size);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem::router
