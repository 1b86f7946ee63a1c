#include "prefill_worker/prefill_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "engine/cuda/cuda_device.h"
#include "rpc/peer_fault.h"
#include "worker/proto_convert.h"

namespace tandem {

using tandem::v1::PrefillEvent;

PrefillService::PrefillService(const WorkerEnv& env, std::unique_ptr<KvSender> sender,
                               int num_transfer_threads)
    : WorkerService(env),
      sender_(std::move(sender)),
      layerwise_(env.options->kv_layerwise_push),
      kv_pool_(env.engine->kv_pool()),
      kv_layout_(env.engine->kv_layout()) {
  if (layerwise_) env.engine->SetKvPushListener(this);
  for (int i = 0; i < num_transfer_threads; ++i) {
    transfer_threads_.emplace_back([this] { TransferThread(); });
  }
}

PrefillService::~PrefillService() { Stop(); }

void PrefillService::Stop() {
  {
    absl::MutexLock l(&jobs_mu_);
    stopping_ = true;
    stop_transfers_.store(true);      // a thread blocked on a peer's socket gives up
    for (Push* p : active_pushes_) {  // a thread waiting for layers or the outcome wakes up
      absl::MutexLock pl(&p->mu);
      AbandonLocked(*p);
    }
  }
  for (auto& t : transfer_threads_) t.join();
  transfer_threads_.clear();
}

EngineLoop::Handlers PrefillService::Handlers() {
  EngineLoop::Handlers h;
  h.on_output = [this](Engine& e, const RequestOutput& out, absl::Time step_start) {
    OnOutput(e, out, step_start);
  };
  h.on_step_error = [this](Engine& e, const absl::Status& st) { OnEngineBroken(e, st); };
  return h;
}

grpc::Status PrefillService::Prefill(grpc::ServerContext* ctx,
                                     const tandem::v1::PrefillRequest* req,
                                     grpc::ServerWriter<PrefillEvent>* writer) {
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  if (grpc::Status st = AdmitNew(); !st.ok()) return st;
  Request state;
  state.channel = std::make_shared<Channel>();
  if (req->has_destination()) state.destination = req->destination();
  state.num_prompt_tokens = req->prompt_tokens_size();
  state.arrival = env_.clock->Now();
  EngineRequest er;
  er.id = req->request_id();
  er.prompt_tokens.assign(req->prompt_tokens().begin(), req->prompt_tokens().end());
  er.sampling = SamplingFromProto(req->sampling());
  er.prefill_only = true;
  er.keep_kv_when_finished = req->keep_kv_when_finished() && req->has_destination();
  std::shared_ptr<Channel> channel = state.channel;
  loop_->Post([this, er = std::move(er), state = std::move(state)](Engine& e) mutable {
    AddOnLoop(e, std::move(er), std::move(state));
  });
  return StreamEvents(ctx, writer, *channel, req->request_id());
}

void PrefillService::AddOnLoop(Engine& engine, EngineRequest request, Request state) {
  if (requests_.contains(request.id)) {
    state.channel->Close(absl::AlreadyExistsError(
        absl::StrCat("request ", request.id, " is already being prefilled here")));
    return;
  }
  const std::string id = request.id;
  if (absl::Status st = engine.AddRequest(std::move(request)); !st.ok()) {
    state.channel->Close(st);
    return;
  }
  requests_.emplace(id, std::move(state));
  num_live_++;
}

void PrefillService::OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start) {
  auto it = requests_.find(out.id);
  if (it == requests_.end()) return;
  Request& r = it->second;
  const absl::Time now = env_.clock->Now();
  if (!out.new_tokens.empty()) {
    PrefillEvent ev;
    auto* first = ev.mutable_first_token();
    first->set_token_id(out.new_tokens[0]);
    // A request kept for its siblings ends kPrefillDone; its own ending is reported all the same.
    first->set_finish_reason(FinishReasonToProto(out.prefill_finish_reason != FinishReason::kNone
                                                     ? out.prefill_finish_reason
                                                     : out.finish_reason));
    if (!out.logprobs.empty()) *first->mutable_logprobs() = LogprobsToProto(out.logprobs[0]);
    // Prompt logprobs are computed here, where the prompt is: they reach the router with the
    // first token.
    for (const TokenLogprobs& lp : out.prompt_logprobs) {
      *first->add_prompt_logprobs() = LogprobsToProto(lp);
    }
    first->set_num_cached_tokens(out.num_cached_tokens);
    // The step that finished the prompt approximates prefill; earlier chunks count as queue.
    const double queue_s = absl::ToDoubleSeconds(step_start - r.arrival);
    const double prefill_s = absl::ToDoubleSeconds(now - step_start);
    first->set_prefill_queue_s(queue_s);
    first->set_prefill_s(prefill_s);
    r.channel->Push(std::move(ev));
    if (env_.metrics) {
      env_.metrics->ObserveQueueTime(queue_s);
      env_.metrics->ObservePrefillTime(prefill_s);
    }
  }
  switch (out.finish_reason) {
    case FinishReason::kNone:
      return;
    case FinishReason::kPrefillDone:
      if (r.push != nullptr) {  // layer-wise: the layers are on their way; Finish may follow
        absl::MutexLock l(&r.push->mu);
        if (r.push->outcome == Push::Outcome::kPending) r.push->outcome = Push::Outcome::kCommit;
        r.push->computed = now;
        r.phase = Phase::kTransferring;
      } else if (r.destination.has_value()) {
        StartTransfer(engine, out.id, r);
      } else {
        (void)engine.ReleaseRequest(out.id);
        Finish(out.id, absl::OkStatus());
      }
      return;
    case FinishReason::kStop:
    case FinishReason::kLength:
      Finish(out.id, absl::OkStatus());
      break;
    case FinishReason::kAbort:
      Finish(out.id, absl::AbortedError("request aborted"));
      break;
    case FinishReason::kError:
      Finish(out.id, absl::InternalError(out.error));
      break;
  }
  if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(out.finish_reason));
}

void PrefillService::StartTransfer(Engine& engine, const std::string& id, Request& r) {
  absl::StatusOr<std::vector<int32_t>> pages = engine.KvPages(id);
  const KvLayout& layout = engine.kv_layout();
  const size_t needed =
      static_cast<size_t>((r.num_prompt_tokens + layout.page_size - 1) / layout.page_size);
  if (!pages.ok() || pages->size() < needed) {
    (void)engine.ReleaseRequest(id);
    Finish(id, absl::InternalError(absl::StrCat("prefill pages of ", id, " missing")));
    return;
  }
  pages->resize(needed);
  r.phase = Phase::kTransferring;
  EnqueueJob(TransferJob{id, *r.destination, *std::move(pages), engine.kv_pool(), layout,
                         r.cancelled, nullptr});
}

void PrefillService::EnqueueJob(TransferJob job) {
  absl::MutexLock l(&jobs_mu_);
  jobs_.push_back(std::move(job));
}

void PrefillService::OnPushBegin(const std::vector<KvPush>& pushes) {
  step_pushes_.clear();
  for (const KvPush& p : pushes) {
    auto it = requests_.find(p.id);
    if (it == requests_.end() || !it->second.destination.has_value() ||
        it->second.cancelled->load()) {
      continue;  // nowhere to push (or going away): the engine's BeforeFree finds no push
    }
    Request& r = it->second;
    r.push = std::make_shared<Push>();
    {
      absl::MutexLock l(&r.push->mu);
      r.push->events.assign(static_cast<size_t>(kv_layout_.num_layers), nullptr);
    }
    step_pushes_.push_back(r.push);
    EnqueueJob(
        TransferJob{p.id, *r.destination, p.pages, kv_pool_, kv_layout_, r.cancelled, r.push});
  }
}

void PrefillService::OnLayerStored(int layer, void* event) {
  for (const std::shared_ptr<Push>& p : step_pushes_) {
    absl::MutexLock l(&p->mu);
    if (layer < 0 || layer >= static_cast<int>(p->events.size())) continue;
    p->events[static_cast<size_t>(layer)] = event;
    p->layers_stored = std::max(p->layers_stored, layer + 1);
  }
}

void PrefillService::BeforeFree(const std::string& id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.push == nullptr) return;
  Push& p = *it->second.push;
  absl::MutexLock l(&p.mu);
  AbandonLocked(p);  // no further SendLayer starts; the one in progress gives up its waits
  auto idle = [&p]() ABSL_SHARED_LOCKS_REQUIRED(p.mu) { return !p.reading; };
  p.mu.Await(absl::Condition(&idle));  // the op in progress ends soon: its waits observe it
}

void PrefillService::AbandonLocked(Push& p) {
  p.outcome = Push::Outcome::kAbandon;
  p.abandoned.store(true);
}

void PrefillService::TransferThread() {
  while (true) {
    TransferJob job;
    {
      absl::MutexLock l(&jobs_mu_);
      auto ready = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(jobs_mu_) { return stopping_ || !jobs_.empty(); };
      jobs_mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      if (job.push != nullptr) active_pushes_.insert(job.push.get());
    }
    absl::StatusOr<KvTransferStats> result = RunTransfer(job);  // its op has ended
    const absl::Time done = env_.clock->Now();
    KvTransferStats stats = result.ok() ? *result : KvTransferStats{};
    // Pages sent after the prefill: all of the transfer is exposed; layer-wise: what came after
    // the prompt's result.
    absl::Duration exposed = stats.duration;
    if (job.push != nullptr) {
      {
        absl::MutexLock l(&job.push->mu);
        job.push->reading = false;  // device copies: waited for when the op ended
        exposed = std::max(absl::ZeroDuration(), done - job.push->computed);
      }
      absl::MutexLock l(&jobs_mu_);
      active_pushes_.erase(job.push.get());
    }
    // The push stays alive in the task: OnTransferDone compares it with the request's.
    loop_->Post([this, id = job.request_id, push = job.push, st = result.status(), stats,
                 exposed](Engine& e) { OnTransferDone(e, id, push.get(), st, stats, exposed); });
  }
}

absl::StatusOr<KvTransferStats> PrefillService::RunTransfer(const TransferJob& job) {
  if (job.cancelled->load()) return absl::AbortedError("request aborted before its KV transfer");
  const std::string& transfer_id =
      job.destination.transfer_id().empty() ? job.request_id : job.destination.transfer_id();
  // Read on this thread between (and inside) the op's socket waits: an abort, an abandoned push
  // or Stop ends a transfer blocked on a silent decode worker at once.
  auto cancelled = [cancelled = job.cancelled, push = job.push, stop = &stop_transfers_] {
    return cancelled->load() || stop->load() || (push != nullptr && push->abandoned.load());
  };
  absl::StatusOr<std::unique_ptr<KvSendOp>> op =
      sender_->Begin(job.destination.kv_transfer_address(), transfer_id, job.layout,
                     static_cast<int>(job.pages.size()),
                     absl::Milliseconds(env_.options->kv_transfer_timeout_ms), cancelled);
  if (!op.ok()) return op.status();
  for (int layer = 0; layer < job.layout.num_layers; ++layer) {
    if (job.cancelled->load()) {
      (*op)->Abort("request aborted on the prefill worker");
      return absl::AbortedError("request aborted during its KV transfer");
    }
    if (job.push != nullptr) {
      if (absl::Status st = SendStoredLayer(job, **op, layer); !st.ok()) return st;
      continue;
    }
    if (absl::Status st = (*op)->SendLayer(layer, job.pool, job.pages, 0); !st.ok()) return st;
  }
  if (job.push != nullptr) {  // every layer went: Finish only for a request that ended prefilled
    Push& p = *job.push;
    absl::MutexLock l(&p.mu);
    auto decided = [&p]() ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
      return p.outcome != Push::Outcome::kPending;
    };
    p.mu.Await(absl::Condition(&decided));
    if (p.outcome == Push::Outcome::kAbandon) {
      (*op)->Abort("the prefill ended without its KV (stopped, aborted or failed)");
      return absl::AbortedError("request ended before its KV transfer completed");
    }
  }
  if (env_.options->kv_transfer_hold_ms > 0) {
    // --kv-transfer-hold-ms (fault tests): every page written, the transfer not yet completed.
    // An abort, an abandoned push or Stop ends the wait as it would end a socket wait.
    const absl::Time until =
        env_.clock->Now() + absl::Milliseconds(env_.options->kv_transfer_hold_ms);
    while (env_.clock->Now() < until) {
      if (cancelled()) {
        (*op)->Abort("the request went away while its KV transfer was held");
        return absl::AbortedError("request ended while its KV transfer was held");
      }
      env_.clock->SleepUntil(std::min(until, env_.clock->Now() + absl::Milliseconds(10)));
    }
  }
  return (*op)->Finish();
}

absl::Status PrefillService::SendStoredLayer(const TransferJob& job, KvSendOp& op, int layer) {
  Push& p = *job.push;
  void* event = nullptr;
  {
    absl::MutexLock l(&p.mu);
    auto ready = [&p, layer]() ABSL_SHARED_LOCKS_REQUIRED(p.mu) {
      return p.layers_stored > layer || p.outcome == Push::Outcome::kAbandon;
    };
    p.mu.Await(absl::Condition(&ready));
    if (p.outcome == Push::Outcome::kAbandon) {
      op.Abort("the prefill ended without its KV (stopped, aborted or failed)");
      return absl::AbortedError("request ended before its KV transfer completed");
    }
    event = p.events[static_cast<size_t>(layer)];
    p.reading = true;  // BeforeFree waits for this read to end
  }
  if (op.OrdersAfterEvents()) {
    // CUDA IPC or NCCL: the copy (the sends) waits for the layer on the device, with no host
    // wait; it may still run after this returns, so `reading` stays set until the op ended
    // (TransferThread clears it once Finish or Abort waited for the copies, or aborted the
    // NCCL communicator, which ends its sends).
    return op.SendLayerAfterEvent(layer, job.pool, job.pages, 0, event);
  }
  absl::Status st = WaitKvEvent(event);
  if (st.ok()) st = op.SendLayer(layer, job.pool, job.pages, 0);
  absl::MutexLock l(&p.mu);
  p.reading = false;
  return st;
}

void PrefillService::OnTransferDone(Engine& engine, const std::string& id, const Push* push,
                                    absl::Status status, const KvTransferStats& stats,
                                    absl::Duration exposed) {
  auto it = requests_.find(id);
  // A push belongs to one request: once that one is gone (ended, its pages freed), an id that
  // came back is another request's.
  if (push != nullptr && (it == requests_.end() || it->second.push.get() != push)) return;
  (void)engine.ReleaseRequest(id);
  if (it == requests_.end()) return;
  if (it->second.cancelled->load()) status = absl::AbortedError("request aborted");
  if (status.ok()) {
    PrefillEvent ev;
    ev.mutable_transfer_done()->set_bytes(stats.bytes);
    ev.mutable_transfer_done()->set_kv_transfer_s(absl::ToDoubleSeconds(stats.duration));
    it->second.channel->Push(std::move(ev));
    if (env_.metrics) {
      env_.metrics->ObserveKvTransfer(absl::ToDoubleSeconds(stats.duration), stats.bytes,
                                      stats.path);
      env_.metrics->ObserveKvExposed(absl::ToDoubleSeconds(exposed));
      env_.metrics->CountRequestOutcome("prefill_done");
    }
    Finish(id, absl::OkStatus());
    return;
  }
  LOG(WARNING) << "KV transfer of " << id << " failed: " << status;
  if (env_.metrics) {
    env_.metrics->CountKvTransferFailure(absl::StatusCodeToString(status.code()));
    env_.metrics->CountRequestOutcome("error");
  }
  // The decode side gave up (or is gone): the router must fail or retry the request, and not
  // take this worker for the one at fault (rpc/peer_fault.h).
  Finish(id, absl::IsAborted(status)
                 ? status
                 : MarkPeerFault(absl::UnavailableError(absl::StrCat(
                                     "KV transfer to decode failed: ", status.message())),
                                 "decode"));
}

void PrefillService::Finish(const std::string& id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  it->second.channel->Close(std::move(status));
  requests_.erase(it);
  num_live_--;
}

bool PrefillService::AbortOnLoop(Engine& engine, const std::string& request_id,
                                 tandem::v1::AbortReason) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  if (it->second.phase == Phase::kTransferring) {
    it->second.cancelled->store(true);  // the transfer thread aborts and reports back
    return true;
  }
  if (!engine.Abort(request_id).ok()) {
    (void)engine.ReleaseRequest(request_id);
    Finish(request_id, absl::AbortedError("request aborted"));
  }
  return true;  // the engine reports kAbort at its next step
}

void PrefillService::FailAllOnLoop(Engine&, const absl::Status& error) {
  const std::string message = EngineFailureMessage(error);
  std::vector<std::string> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (const std::string& id : ids) {
    // A transfer in flight stops at its next layer; its OnTransferDone finds nothing left.
    requests_.at(id).cancelled->store(true);
    if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(FinishReason::kError));
    Finish(id, absl::InternalError(message));
  }
}

}  // namespace tandem
