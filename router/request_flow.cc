#include "router/request_flow.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "router/worker_calls.h"
#include "router/worker_proto.h"
#include "rpc/peer_fault.h"

namespace tandem::router {
namespace {

using tandem::v1::AbortReason;
using tandem::v1::PrefillEvent;
using tandem::v1::PrefillRequest;
using tandem::v1::ReservePagesRequest;
using tandem::v1::ReservePagesResponse;
using tandem::v1::TokenEvent;

constexpr absl::Duration kReserveBackoff = absl::Milliseconds(50);

}  // namespace

RequestFlow::RequestFlow(FlowDeps* deps, GenerateSpec spec, std::string worker_request_id,
                         std::shared_ptr<GenerationSink> sink)
    : RequestFlow(deps, std::move(spec), std::move(worker_request_id),
                  std::vector<std::shared_ptr<GenerationSink>>{std::move(sink)}) {}

RequestFlow::RequestFlow(FlowDeps* deps, GenerateSpec spec, std::string worker_request_id,
                         std::vector<std::shared_ptr<GenerationSink>> sinks)
    : deps_(deps),
      spec_(std::move(spec)),
      worker_request_id_(std::move(worker_request_id)),
      arrival_(deps->options.clock->Now()) {
  ++deps_->flow_objects;
  for (std::shared_ptr<GenerationSink>& sink : sinks) {
    sequences_.push_back(
        std::make_unique<Sequence>(deps_->tokenizer, spec_.sampling, std::move(sink)));
  }
  live_sequences_ = static_cast<int>(sequences_.size());
  query_.num_prompt_tokens = static_cast<int>(spec_.prompt_tokens.size());
  query_.prompt_tokens = &spec_.prompt_tokens;
}

RequestFlow::~RequestFlow() { --deps_->flow_objects; }

void RequestFlow::Run(Actions& later) {
  for (auto& action : later) action();
  later.clear();
}

void RequestFlow::SetTicket(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  ticket_ = ticket;
}

void RequestFlow::Start() {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    admitted_ = true;
    if (phase_ == Phase::kDone) {  // cancelled while its start was already on its way
      later.push_back([this, ticket = ticket_] { deps_->admission->Release(ticket); });
    } else {
      admitted_at_ = deps_->options.clock->Now();
      reserve_deadline_ = admitted_at_ + deps_->options.reserve_retry_budget;
      deps_->metrics->prompt_tokens().Increment(static_cast<double>(spec_.prompt_tokens.size()));
      later.push_back([self = shared_from_this()] { self->Route(); });
    }
  }
  Run(later);
}

void RequestFlow::Route() {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    phase_ = Phase::kRouting;
    absl::StatusOr<RoutePlan> plan = deps_->policy->Pick(deps_->registry->Snapshot(), query_);
    if (!plan.ok()) {
      Fail(plan.status(), later);
    } else {
      mixed_ = plan->mixed;
      decode_ = plan->decode;
      deps_->registry->AddOutstanding(decode_->id, decode_->epoch, 1);
      if (!plan->mixed) {
        prefill_ = plan->prefill;
        deps_->registry->AddOutstanding(prefill_->id, prefill_->epoch, 1);
      }
      later.push_back([self = shared_from_this(), plan = *plan] {
        if (plan.mixed) {
          self->StartMixed(plan);
        } else {
          self->Reserve(plan);
        }
      });
    }
  }
  Run(later);
}

bool RequestFlow::RetryRoute(absl::Duration delay, Actions& later) {
  ReleaseWorker(prefill_);
  ReleaseWorker(decode_);
  later.push_back([self = shared_from_this(), delay] {
    if (delay <= absl::ZeroDuration()) {
      self->Route();
    } else {
      self->deps_->timers->RunAfter(delay, [self] { self->Route(); });
    }
  });
  return true;
}

void RequestFlow::Reserve(const RoutePlan& plan) {
  std::shared_ptr<WorkerStub> stub = deps_->registry->Stub(plan.decode.id, plan.decode.epoch);
  ReservePagesRequest request;
  request.set_request_id(worker_request_id_);
  request.set_num_prompt_tokens(static_cast<int32_t>(spec_.prompt_tokens.size()));
  request.set_max_tokens(spec_.sampling.max_tokens);  // of each sequence
  request.set_ttl_ms(deps_->options.reservation_ttl_ms);
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    phase_ = Phase::kReserving;
    abort_decode_ = plan.decode;
  }
  if (stub == nullptr) {  // re-registered or gone since the snapshot
    OnReserved(plan.decode, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is gone"), {});
    return;
  }
  UnaryCall<ReservePagesRequest, ReservePagesResponse>::Start(
      std::move(request), deps_->options.rpc_timeout,
      [stub](auto* c, auto* q, auto* r, auto cb) { stub->async()->ReservePages(c, q, r, cb); },
      [self = shared_from_this(), decode = plan.decode](const grpc::Status& status,
                                                        const ReservePagesResponse& response) {
        self->OnReserved(decode, status, response);
      });
}

void RequestFlow::OnReserved(const WorkerRef& decode, const grpc::Status& status,
                             const ReservePagesResponse& response) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) {
      // The flow ended while the reservation was in flight: release it (again; the first
      // Abort, sent when the flow ended, may have overtaken it). Not through abort_decode_:
      // ending the flow reset it, and an abort to no worker left the reservation until its TTL.
      if (status.ok())
        later.push_back([this, self = shared_from_this(), decode] {
          SendAbort(decode, tandem::v1::ABORT_REASON_CLIENT_CANCELLED);
        });
    } else if (status.ok()) {
      phase_ = Phase::kPrefilling;
      later.push_back([self = shared_from_this(), response] { self->StartPrefill(response); });
    } else if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      abort_decode_.reset();
      if (deps_->options.clock->Now() >= reserve_deadline_) {
        Fail(absl::ResourceExhaustedError(
                 "no decode worker had free KV pages for this request within the retry budget"),
             later);
      } else {
        query_.excluded.insert(decode.id);
        const bool others =
            !Candidates(deps_->registry->Snapshot(), tandem::v1::WORKER_ROLE_DECODE, query_)
                 .empty();
        if (!others) query_.excluded.clear();
        RetryRoute(others ? absl::ZeroDuration() : kReserveBackoff, later);
      }
    } else if ((status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
               ++route_attempts_ < deps_->options.max_route_attempts) {
      LOG(WARNING) << "request " << worker_request_id_ << ": decode worker '" << decode.id
                   << "' unreachable (" << status.error_message() << "); routing again";
      // A timed-out call may still have reserved: release it. Either way this flow no longer
      // depends on the worker (so its going down must not fail the retry).
      abort_decode_.reset();
      if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        later.push_back([this, self = shared_from_this(), decode] {
          SendAbort(decode, tandem::v1::ABORT_REASON_PEER_FAILED);
        });
      }
      later.push_back(
          [this, decode] { deps_->registry->ReportUnreachable(decode.id, decode.epoch); });
      RetryRoute(absl::ZeroDuration(), later);
    } else {
      Fail(WorkerCallError(status, decode.id, "ReservePages"), later);
    }
  }
  Run(later);
}

void RequestFlow::StartPrefill(const ReservePagesResponse& reservation) {
  PrefillRequest request;
  std::shared_ptr<grpc::ClientContext> context = std::make_shared<grpc::ClientContext>();
  std::shared_ptr<WorkerStub> stub;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone || !prefill_) return;
    stub = deps_->registry->Stub(prefill_->id, prefill_->epoch);
    abort_prefill_ = prefill_;
    prefill_ctx_ = context;
  }
  request.set_request_id(worker_request_id_);
  request.mutable_prompt_tokens()->Add(spec_.prompt_tokens.begin(), spec_.prompt_tokens.end());
  *request.mutable_sampling() = ToProto(spec_.sampling);
  tandem::v1::KvDestination* dest = request.mutable_destination();
  dest->set_decode_worker_id(reservation.decode_worker_id());
  dest->set_kv_transfer_address(reservation.kv_transfer_address());
  *dest->mutable_page_ids() = reservation.page_ids();
  dest->set_transfer_id(worker_request_id_);
  // The decode worker forks the siblings from this KV, whatever sequence 0's first token does.
  request.set_keep_kv_when_finished(sequences_.size() > 1);
  if (stub == nullptr) {
    OnPrefillDone(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is gone"));
    return;
  }
  StreamReader<PrefillRequest, PrefillEvent>::Start(
      context, std::move(request),
      [stub](auto* c, auto* r, auto* x) { stub->async()->Prefill(c, r, x); },
      [self = shared_from_this()](const PrefillEvent& e) { self->OnPrefillEvent(e); },
      [self = shared_from_this()](const grpc::Status& s) { self->OnPrefillDone(s); });
}

void RequestFlow::OnPrefillEvent(const PrefillEvent& event) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    if (event.has_first_token()) {
      const tandem::v1::FirstToken& first = event.first_token();
      timings_.set_prefill_queue_s(first.prefill_queue_s());
      timings_.set_prefill_s(first.prefill_s());
      first_token_ = first.token_id();
      cached_tokens_ = first.num_cached_tokens();
      google::protobuf::RepeatedField<int32_t> ids;
      ids.Add(first.token_id());
      google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs> logprobs;
      if (first.has_logprobs()) *logprobs.Add() = first.logprobs();
      EmitTokens(0, ids, logprobs, later, &first.prompt_logprobs());
      if (phase_ != Phase::kDone &&
          first.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        // Finished at prefill. Alone: no transfer, nothing held. With siblings: the transfer
        // goes on (keep_kv_when_finished) and the decode worker decodes the siblings only.
        if (sequences_.size() == 1) abort_prefill_.reset();
        FinishSequence(0, first.finish_reason(), /*router_ended=*/false, later);
      }
    } else if (event.has_transfer_done()) {
      timings_.set_kv_transfer_s(event.transfer_done().kv_transfer_s());
      timings_.set_kv_transfer_bytes(event.transfer_done().bytes());
      if (first_token_ < 0) {
        Fail(absl::InternalError("prefill worker reported the transfer before the first token"),
             later);
      } else if (phase_ == Phase::kPrefilling) {
        StartDecode(later);
      }
    }
  }
  Run(later);
}

void RequestFlow::OnPrefillDone(const grpc::Status& status) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    prefill_stream_done_ = true;
    const WorkerRef prefill = abort_prefill_.value_or(prefill_.value_or(WorkerRef{}));
    if (status.ok()) abort_prefill_.reset();
    // Unreachable only if it did not answer: a worker that says its KV transfer to the decode
    // worker failed (rpc/peer_fault.h) is up, and the decode worker's own calls judge that one.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE &&
        !(prefill_ctx_ && ReportsPeerFault(*prefill_ctx_))) {
      later.push_back(
          [this, prefill] { deps_->registry->ReportUnreachable(prefill.id, prefill.epoch); });
    }
    if (phase_ == Phase::kDone) {
      // Nothing more to say to the client.
    } else if (!status.ok()) {
      Fail(WorkerCallError(status, prefill.id, "Prefill"), later);
    } else if (phase_ == Phase::kPrefilling) {
      Fail(absl::UnavailableError(
               absl::StrCat("prefill worker '", prefill.id, "' ended without transferring the KV")),
           later);
    }
    ReleaseWorker(prefill_);
  }
  Run(later);
}

}  // namespace tandem::router
