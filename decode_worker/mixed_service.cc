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
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  if (grpc::Status st = AdmitNew(); !st.ok()) return st;
  auto channel = std::make_shared<Channel>();
  EngineRequest er;
  er.id = req->request_id();
  er.prompt_tokens.assign(req->prompt_tokens().begin(), req->prompt_tokens().end());
  er.sampling = SamplingFromProto(req->sampling());
  er.siblings = SiblingsFromProto(req->siblings());
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
  SequenceSet sequences = SequenceSet::For(id, request.siblings);
  if (absl::Status st = engine.AddRequest(std::move(request)); !st.ok()) {
    channel->Close(st);
    return;
  }
  owners_.Add(sequences);
  requests_.emplace(id, Request{std::move(channel), env_.clock->Now(), 0, std::move(sequences)});
  num_live_++;
}

void MixedService::OnOutput(Engine&, const RequestOutput& out, absl::Time step_start) {
  const std::string id = owners_.RequestOf(out.id);
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  const int sequence = r.sequences.IndexOf(out.id);
  if (sequence < 0) return;
  TokenEvent ev = TokenEventFor(out);
  ev.set_sequence(sequence);
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
  // A sequence aborted alone (a stop string) gets its terminal event; a whole request aborted
  // ends its stream ABORTED.
  if (out.finish_reason != FinishReason::kAbort || !r.sequences.aborted) {
    r.channel->Push(std::move(ev));
  }
  if (!r.sequences.End(sequence)) return;
  Finish(id, r.sequences.aborted ? absl::AbortedError("request aborted") : absl::OkStatus());
}

void MixedService::Finish(const std::string& id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second.channel->Close(std::move(status));
  if (env_.metrics) {
    env_.metrics->ObserveRequestDuration(
        absl::ToDoubleSeconds(env_.clock->Now() - it->second.arrival));
  }
  owners_.Remove(it->second.sequences);
  requests_.erase(it);
  num_live_--;
}

bool MixedService::AbortOnLoop(Engine& engine, const std::string& request_id,
                               tandem::v1::AbortReason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  it->second.sequences.aborted = true;
  bool pending = false;  // the engine reports kAbort for each at its next step
  for (const std::string& id : it->second.sequences.LiveIds()) pending |= engine.Abort(id).ok();
  if (!pending) Finish(request_id, absl::AbortedError("request aborted"));
  return true;
}

bool MixedService::AbortSequenceOnLoop(Engine& engine, const std::string& request_id,
                                       int sequence) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  SequenceSet& set = it->second.sequences;
  if (sequence < 0 || sequence >= static_cast<int>(set.ids.size()) || set.ended[sequence]) {
    return false;
  }
  return engine.Abort(set.ids[sequence]).ok();  // kAbort for it at the next step
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
