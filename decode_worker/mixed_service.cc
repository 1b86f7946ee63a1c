#include "decode_worker/mixed_service.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/proto_convert.h"

namespace tandem {

using tandem::v1::TokenEvent;

EngineLoop::Handlers MixedService::Handlers() {
  EngineLoop::Handlers h;
  h.on_output = [this](Engine& e, const RequestOutput& out, absl::Time step_start) {
    OnOutput(e, out, step_start);
  };
  h.on_step_error = [this](Engine& e, const absl::Status& st) { OnEngineBroken(e, st); };
  return h;
}

grpc::Status MixedService::Generate(grpc::ServerContext* ctx,
                                    const tandem::v1::WorkerGenerateRequest* req,
                                    grpc::ServerWriter<TokenEvent>* writer) {
  if (grpc::Status st = AdmitNew(); !st.ok()) return st;
  auto channel = std::make_shared<Channel>();
  EngineRequest er;
  er.id = req->request_id();
  er.prompt_tokens.assign(req->prompt_tokens().begin(), req->prompt_tokens().end());
  er.sampling = SamplingFromProto(req->sampling());
  loop_->Post([this, er = std::move(er), channel](Engine& e) mutable {
    GenerateOnLoop(e, std::move(er), channel);
  });
  return StreamEvents(ctx, writer, *channel, req->request_id());
}

void MixedService::GenerateOnLoop(Engine& engine, EngineRequest request,
                                  std::shared_ptr<Channel> channel) {
  if (requests_.contains(request.id)) {
    channel->Close(absl::AlreadyExistsError(absl::StrCat("request ", request.id, " is live")));
    return;
  }
  const std::string id = request.id;
  if (absl::Status st = engine.AddRequest(std::move(request)); !st.ok()) {
    channel->Close(st);
    return;
  }
  requests_.emplace(id, Request{std::move(channel), env_.clock->Now()});
  num_live_++;
}

void MixedService::OnOutput(Engine&, const RequestOutput& out, absl::Time step_start) {
  auto it = requests_.find(out.id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  TokenEvent ev = TokenEventFor(out);
  if (r.num_outputs++ == 0) {
    // The step that sampled the first token approximates prefill; earlier chunks count as queue.
    tandem::v1::PhaseTimings* t = ev.mutable_timings();
    t->set_prefill_queue_s(absl::ToDoubleSeconds(step_start - r.arrival));
    t->set_prefill_s(absl::ToDoubleSeconds(env_.clock->Now() - step_start));
    if (env_.metrics) {
      env_.metrics->ObserveQueueTime(t->prefill_queue_s());
      env_.metrics->ObservePrefillTime(t->prefill_s());
    }
  }
  if (out.finish_reason == FinishReason::kNone) {
    if (!out.new_tokens.empty()) r.channel->Push(std::move(ev));
    return;
  }
  if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(out.finish_reason));
  if (out.finish_reason == FinishReason::kAbort) {
    Finish(out.id, absl::AbortedError("request aborted"));
    return;
  }
  r.channel->Push(std::move(ev));
  Finish(out.id, absl::OkStatus());
}

void MixedService::Finish(const std::string& id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second.channel->Close(std::move(status));
  if (env_.metrics) {
    env_.metrics->ObserveRequestDuration(
        absl::ToDoubleSeconds(env_.clock->Now() - it->second.arrival));
  }
  requests_.erase(it);
  num_live_--;
}

bool MixedService::AbortOnLoop(Engine& engine, const std::string& request_id,
                               tandem::v1::AbortReason) {
  if (!requests_.contains(request_id)) return false;
  if (!engine.Abort(request_id).ok()) Finish(request_id, absl::AbortedError("request aborted"));
  return true;  // otherwise the engine reports kAbort at its next step
}

void MixedService::FailAllOnLoop(Engine&, const absl::Status& error) {
  RequestOutput failed;
  failed.finish_reason = FinishReason::kError;
  failed.error = EngineFailureMessage(error);
  std::vector<std::string> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (const std::string& id : ids) {
    failed.id = id;
    requests_.at(id).channel->Push(TokenEventFor(failed));
    if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(FinishReason::kError));
    Finish(id, absl::OkStatus());
  }
}

}  // namespace tandem
