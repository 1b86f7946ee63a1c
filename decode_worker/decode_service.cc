#include "decode_worker/decode_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "comm/tcp_kv_receiver.h"
#include "rpc/peer_fault.h"
#include "worker/kv_group_shape.h"
#include "worker/kv_ipc_setup.h"
#include "worker/kv_pool_copy.h"
#include "worker/proto_convert.h"

namespace tandem {

using tandem::v1::TokenEvent;

DecodeService::DecodeService(const WorkerEnv& env) : WorkerService(env) {}

DecodeService::~DecodeService() = default;

absl::StatusOr<std::unique_ptr<DecodeService>> DecodeService::Create(const WorkerEnv& env) {
  std::unique_ptr<DecodeService> s(new DecodeService(env));
  DecodeService* self = s.get();
  absl::StatusOr<std::unique_ptr<TcpKvReceiver>> receiver = TcpKvReceiver::Create(
      env.options->host, env.options->kv_port, env.engine->kv_pool(), env.engine->kv_layout(),
      [self](const std::string& id, absl::Status st, KvTransferStats stats) {
        self->loop_->Post([self, id, st, stats](Engine& e) { self->OnKvDone(e, id, st, stats); });
      },
      env.clock, PoolCopyFor(env.engine), env.options->cluster_token);
  if (!receiver.ok()) return receiver.status();
  // Prefill groups of other TP / PP sizes: their pages land through the head map.
  absl::StatusOr<KvGroupShape> group = KvGroupShapeFor(env.options->engine, *env.engine);
  if (!group.ok()) return group.status();
  if (absl::Status st = (*receiver)->SetGroupShape(*group); !st.ok()) return st;
  // CUDA IPC: the pool is exported once; senders that ask for IPC get the handle.
  absl::StatusOr<std::shared_ptr<KvIpcDevice>> ipc = KvIpcFor(*env.options, *env.engine);
  if (!ipc.ok()) return ipc.status();
  if (*ipc != nullptr) {
    absl::StatusOr<std::string> handle = (*ipc)->ExportPool(env.engine->kv_pool());
    if (handle.ok()) {
      (*receiver)->SetIpcExport(*std::move(handle));
    } else if (env.options->kv_transport == KvTransportKind::kIpc) {
      return handle.status();
    } else {
      LOG(WARNING) << "KV transport auto: the KV pool cannot be exported for CUDA IPC, senders "
                      "use TCP: "
                   << handle.status();
    }
  }
  // NCCL: senders on other GPUs send the pages by NCCL (comm/nccl_kv_transport.h).
  absl::StatusOr<std::shared_ptr<NcclKvTransport>> nccl = NcclFor(*env.options, *env.engine);
  if (!nccl.ok()) return nccl.status();
  if (*nccl != nullptr) (*receiver)->SetNccl(*std::move(nccl));
  s->receiver_ = *std::move(receiver);
  // Advertise the routable host with the receiver's bound port.
  const std::string addr = s->receiver_->address();
  s->kv_transfer_address_ = absl::StrCat(env.options->advertise_host, addr.substr(addr.rfind(':')));
  return s;
}

void DecodeService::Stop() {
  // On the loop, so that no task uses the receiver once it is gone: the reservations still
  // waiting for their KV (the only state that uses it) are dropped first.
  loop_->RunSync([this](Engine& engine) {
    std::vector<std::string> reserved;
    for (const auto& [id, r] : requests_) {
      if (r.state == State::kReserved) reserved.push_back(id);
    }
    for (const std::string& id : reserved) {
      DropReservation(engine, id, absl::UnavailableError("the decode worker is stopping"));
    }
    receiver_.reset();  // its threads are joined: nothing posts OnKvDone any more
  });
}

std::string DecodeService::kv_transfer_address() const { return kv_transfer_address_; }

EngineLoop::Handlers DecodeService::Handlers() {
  EngineLoop::Handlers h;
  h.on_output = [this](Engine& e, const RequestOutput& out, absl::Time step_start) {
    OnOutput(e, out, step_start);
  };
  h.on_step_error = [this](Engine& e, const absl::Status& st) { OnEngineBroken(e, st); };
  h.on_tick = [this](Engine& e) { OnTick(e); };
  return h;
}

grpc::Status DecodeService::ReservePages(grpc::ServerContext* ctx,
                                         const tandem::v1::ReservePagesRequest* req,
                                         tandem::v1::ReservePagesResponse* resp) {
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  if (grpc::Status st = AdmitNew(); !st.ok()) return st;
  absl::StatusOr<std::vector<int32_t>> pages;
  loop_->RunSync([&](Engine& e) { pages = ReserveOnLoop(e, *req); });
  if (!pages.ok()) return ToGrpc(pages.status());
  resp->mutable_page_ids()->Assign(pages->begin(), pages->end());
  resp->set_kv_transfer_address(kv_transfer_address());
  resp->set_decode_worker_id(env_.options->worker_id);
  resp->set_page_size(env_.engine->kv_layout().page_size);
  return grpc::Status::OK;
}

absl::StatusOr<std::vector<int32_t>> DecodeService::ReserveOnLoop(
    Engine& engine, const tandem::v1::ReservePagesRequest& req) {
  const std::string& id = req.request_id();
  if (requests_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("request ", id, " already holds pages here"));
  }
  if (lent_.contains(id)) {
    return absl::UnavailableError(
        absl::StrCat("request ", id,
                     ": the pages of its earlier attempt are still written by a prefill worker"));
  }
  if (req.num_prompt_tokens() + std::max(req.max_tokens(), 1) > engine.max_model_len()) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt ", req.num_prompt_tokens(), " + max_tokens ", req.max_tokens(),
                     " exceeds the context ", engine.max_model_len()));
  }
  absl::StatusOr<std::vector<int32_t>> pages = engine.ReservePages(id, req.num_prompt_tokens());
  if (!pages.ok()) return pages.status();
  const absl::Time now = env_.clock->Now();
  absl::Status expect =
      receiver_->Expect(id, *pages, now + absl::Milliseconds(env_.options->kv_transfer_timeout_ms));
  if (!expect.ok()) {
    (void)engine.ReleaseRequest(id);
    return expect;
  }
  failed_.erase(id);
  Request r;
  r.arrival = now;
  const int64_t ttl_ms = req.ttl_ms() > 0 ? req.ttl_ms() : env_.options->reservation_ttl_ms;
  r.ttl_deadline = now + absl::Milliseconds(ttl_ms);
  requests_.emplace(id, std::move(r));
  num_live_++;
  return pages;
}

grpc::Status DecodeService::GenerateFromPrefill(grpc::ServerContext* ctx,
                                                const tandem::v1::GenerateFromPrefillRequest* req,
                                                grpc::ServerWriter<TokenEvent>* writer) {
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  // No AdmitNew(): a claim finishes a request already in flight, even while draining.
  auto channel = std::make_shared<Channel>();
  EngineRequest er;
  er.id = req->request_id();
  er.prompt_tokens.assign(req->prompt_tokens().begin(), req->prompt_tokens().end());
  er.sampling = SamplingFromProto(req->sampling());
  er.siblings = SiblingsFromProto(req->siblings());
  loop_->Post([this, er = std::move(er), first = req->first_token(),
               first_finished = req->first_token_finished(), channel](Engine& e) mutable {
    ClaimOnLoop(e, std::move(er), first, first_finished, channel);
  });
  return StreamEvents(ctx, writer, *channel, req->request_id());
}

void DecodeService::ClaimOnLoop(Engine& engine, EngineRequest request, int32_t first_token,
                                bool first_token_finished, std::shared_ptr<Channel> channel) {
  auto it = requests_.find(request.id);
  if (it == requests_.end()) {
    auto failed = failed_.find(request.id);
    channel->Close(failed != failed_.end()
                       ? failed->second.first
                       : absl::NotFoundError(absl::StrCat("no reservation for request ", request.id,
                                                          " (expired or aborted)")));
    if (failed != failed_.end()) failed_.erase(failed);
    return;
  }
  Request& r = it->second;
  if (r.channel != nullptr) {
    channel->Close(absl::AlreadyExistsError("reservation already claimed"));
    return;
  }
  r.channel = std::move(channel);
  r.first_token = first_token;
  r.first_token_finished = first_token_finished;
  r.pending = std::move(request);
  if (r.kv_ready) Commit(engine, it->first, r);
}

void DecodeService::OnKvDone(Engine& engine, const std::string& id, const absl::Status& status,
                             const KvTransferStats& stats) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state != State::kReserved) return;
  Request& r = it->second;
  if (status.ok()) {
    r.kv_ready = true;
    r.kv_stats = stats;
    if (env_.metrics) {
      env_.metrics->ObserveKvTransfer(absl::ToDoubleSeconds(stats.duration), stats.bytes,
                                      stats.path);
    }
    if (r.pending.has_value()) Commit(engine, id, r);
    return;
  }
  LOG(WARNING) << "KV transfer of " << id << " failed: " << status;
  if (env_.metrics) env_.metrics->CountKvTransferFailure(absl::StatusCodeToString(status.code()));
  const absl::Status error = MarkPeerFault(
      absl::UnavailableError(absl::StrCat("KV transfer from prefill failed: ", status.message())),
      "prefill");
  if (r.channel == nullptr) failed_[id] = {error, r.ttl_deadline};
  DropReservation(engine, id, error);
}

void DecodeService::Commit(Engine& engine, const std::string& id, Request& r) {
  SequenceSet sequences = SequenceSet::For(id, r.pending->siblings);
  absl::Status st =
      engine.AddPrefilledRequest(*std::move(r.pending), r.first_token, r.first_token_finished);
  r.pending.reset();
  if (!st.ok()) {
    DropReservation(engine, id, st);
    return;
  }
  if (r.first_token_finished) sequences.End(0);  // ended on the prefill worker
  r.sequences = std::move(sequences);
  owners_.Add(r.sequences);
  r.state = State::kRunning;
  r.joined = env_.clock->Now();
}

void DecodeService::DropReservation(Engine& engine, const std::string& id,
                                    const absl::Status& status) {
  // The pages are free once no byte of the sender lands any more: inside Cancel, or (a CUDA IPC
  // sender holding the write grant) later, on a transport thread; never wait for a sender here.
  struct Released {
    absl::Mutex mu;
    bool in_cancel ABSL_GUARDED_BY(mu) = true;
    bool now ABSL_GUARDED_BY(mu) = false;
  };
  auto released = std::make_shared<Released>();
  const bool live = receiver_->Cancel(id, [this, id, released] {
    absl::MutexLock l(&released->mu);
    if (released->in_cancel) {
      released->now = true;
      return;
    }
    loop_->Post([this, id](Engine& e) { ReleaseLent(e, id); });  // runs after this task
  });
  bool free_now;
  {
    absl::MutexLock l(&released->mu);
    released->in_cancel = false;
    free_now = !live || released->now;
  }
  if (free_now) {
    (void)engine.ReleaseRequest(id);
  } else {
    LOG(INFO) << "request " << id << ": pages stay reserved until the prefill worker's CUDA IPC "
              << "writes end";
    lent_.insert(id);
  }
  Finish(id, status);
}

void DecodeService::ReleaseLent(Engine& engine, const std::string& id) {
  if (lent_.erase(id) > 0) (void)engine.ReleaseRequest(id);
}

void DecodeService::Finish(const std::string& id, absl::Status status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  if (it->second.channel != nullptr) it->second.channel->Close(std::move(status));
  if (env_.metrics) {
    env_.metrics->ObserveRequestDuration(
        absl::ToDoubleSeconds(env_.clock->Now() - it->second.arrival));
  }
  owners_.Remove(it->second.sequences);
  requests_.erase(it);
  num_live_--;
}

void DecodeService::OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start) {
  const std::string id = owners_.RequestOf(out.id);
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.state != State::kRunning) return;
  Request& r = it->second;
  const int sequence = r.sequences.IndexOf(out.id);
  if (sequence < 0) return;
  TokenEvent ev = TokenEventFor(out);
  ev.set_sequence(sequence);
  tandem::v1::PhaseTimings* t = ev.mutable_timings();
  if (r.num_outputs++ == 0) {
    t->set_first_decode_step_s(absl::ToDoubleSeconds(env_.clock->Now() - r.joined));
    if (env_.metrics) env_.metrics->ObserveFirstDecodeStep(t->first_decode_step_s());
  }
  if (out.finish_reason == FinishReason::kNone) {
    if (!out.new_tokens.empty()) r.channel->Push(std::move(ev));
    return;
  }
  if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(out.finish_reason));
  t->set_kv_transfer_s(absl::ToDoubleSeconds(r.kv_stats.duration));
  t->set_kv_transfer_bytes(r.kv_stats.bytes);
  // A sequence aborted alone (a stop string) gets its terminal event; a whole request aborted
  // ends its stream ABORTED.
  if (out.finish_reason != FinishReason::kAbort || !r.sequences.aborted) {
    r.channel->Push(std::move(ev));
  }
  if (!r.sequences.End(sequence)) return;
  Finish(id, r.sequences.aborted ? absl::AbortedError("request aborted") : absl::OkStatus());
}

void DecodeService::ForgetRouterStateBefore(absl::Time cutoff) {
  loop_->Post([this, cutoff](Engine& engine) {
    std::vector<std::string> stale;
    for (const auto& [id, r] : requests_) {
      if (r.state == State::kReserved && r.channel == nullptr && r.arrival < cutoff) {
        stale.push_back(id);
      }
    }
    if (!stale.empty()) {
      LOG(WARNING) << "registered again with the router: releasing " << stale.size()
                   << " unclaimed reservations it made before";
    }
    for (const std::string& id : stale) {
      DropReservation(engine, id, absl::AbortedError("the router that reserved it is gone"));
    }
  });
}

void DecodeService::OnTick(Engine& engine) {
  const absl::Time now = env_.clock->Now();
  std::vector<std::string> expired;
  for (const auto& [id, r] : requests_) {
    if (r.state == State::kReserved && r.channel == nullptr && r.ttl_deadline <= now) {
      expired.push_back(id);
    }
  }
  for (const std::string& id : expired) {
    LOG(WARNING) << "reservation " << id << " was never claimed; releasing its pages";
    DropReservation(engine, id, absl::DeadlineExceededError("reservation expired"));
  }
  absl::erase_if(failed_, [now](const auto& kv) { return kv.second.second <= now; });
}

bool DecodeService::AbortOnLoop(Engine& engine, const std::string& request_id,
                                tandem::v1::AbortReason) {
  failed_.erase(request_id);
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  if (it->second.state == State::kReserved) {
    DropReservation(engine, request_id, absl::AbortedError("request aborted"));
    return true;
  }
  SequenceSet& set = it->second.sequences;
  set.aborted = true;
  bool pending = false;  // the engine reports kAbort for each at its next step
  for (const std::string& id : set.LiveIds()) pending |= engine.Abort(id).ok();
  if (!pending) Finish(request_id, absl::AbortedError("request aborted"));
  return true;
}

bool DecodeService::AbortSequenceOnLoop(Engine& engine, const std::string& request_id,
                                        int sequence) {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second.state != State::kRunning) return false;
  SequenceSet& set = it->second.sequences;
  if (sequence < 0 || sequence >= static_cast<int>(set.ids.size()) || set.ended[sequence]) {
    return false;
  }
  return engine.Abort(set.ids[sequence]).ok();  // kAbort for it at the next step
}

void DecodeService::FailAllOnLoop(Engine&, const absl::Status& error) {
  RequestOutput failed;
  failed.finish_reason = FinishReason::kError;
  failed.error = EngineFailureMessage(error);
  std::vector<std::string> ids;
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (const std::string& id : ids) {
    Request& r = requests_.at(id);
    if (r.state == State::kReserved) {
      // The prefill worker's push is refused from now on; the broken engine's pages are not
      // reused, so nothing waits for a sender's grant to end.
      receiver_->Cancel(id, nullptr);
      if (r.channel == nullptr)
        failed_[id] = {absl::UnavailableError(failed.error), r.ttl_deadline};
    }
    if (r.channel != nullptr) {
      failed.id = id;
      r.channel->Push(TokenEventFor(failed));
      if (env_.metrics) env_.metrics->CountRequestOutcome(FinishReasonName(FinishReason::kError));
    }
    Finish(id, absl::OkStatus());
  }
}

}  // namespace tandem
