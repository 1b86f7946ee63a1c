// RequestFlow, second half: the token streams (decode after prefill, or a mixed worker),
// cancellation and worker loss.
#include "absl/strings/str_cat.h"
#include "router/request_flow.h"
#include "router/worker_calls.h"
#include "router/worker_proto.h"
#include "rpc/peer_fault.h"

namespace tandem::router {
namespace {

using tandem::v1::GenerateFromPrefillRequest;
using tandem::v1::TokenEvent;
using tandem::v1::WorkerGenerateRequest;

}  // namespace

void RequestFlow::StartDecode(Actions& later) {
  phase_ = Phase::kDecoding;
  std::shared_ptr<WorkerStub> stub = deps_->registry->Stub(decode_->id, decode_->epoch);
  auto context = std::make_shared<grpc::ClientContext>();
  decode_ctx_ = context;
  GenerateFromPrefillRequest request;
  request.set_request_id(worker_request_id_);
  request.mutable_prompt_tokens()->Add(spec_.prompt_tokens.begin(), spec_.prompt_tokens.end());
  *request.mutable_sampling() = ToProto(spec_.sampling);
  // The prompt was computed by the prefill worker, which sent its logprobs with the first token.
  request.mutable_sampling()->clear_prompt_logprobs();
  request.set_first_token(first_token_);
  AddSiblings(request.mutable_siblings());
  // Sequence 0 ended at its first token (or by a stop string in it): only the siblings decode.
  request.set_first_token_finished(sequences_[0]->sink == nullptr);
  later.push_back([self = shared_from_this(), stub, context, request = std::move(request)] {
    if (stub == nullptr) {
      self->OnDecodeDone(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is gone"));
      return;
    }
    StreamReader<GenerateFromPrefillRequest, TokenEvent>::Start(
        context, request,
        [stub](auto* c, auto* r, auto* x) { stub->async()->GenerateFromPrefill(c, r, x); },
        [self](const TokenEvent& e) { self->OnTokenEvent(e); },
        [self](const grpc::Status& s) { self->OnDecodeDone(s); });
  });
}

void RequestFlow::StartMixed(const RoutePlan& plan) {
  std::shared_ptr<WorkerStub> stub = deps_->registry->Stub(plan.decode.id, plan.decode.epoch);
  auto context = std::make_shared<grpc::ClientContext>();
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    phase_ = Phase::kDecoding;
    abort_decode_ = plan.decode;
    decode_ctx_ = context;
  }
  if (stub == nullptr) {
    OnDecodeDone(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is gone"));
    return;
  }
  WorkerGenerateRequest request;
  request.set_request_id(worker_request_id_);
  request.mutable_prompt_tokens()->Add(spec_.prompt_tokens.begin(), spec_.prompt_tokens.end());
  *request.mutable_sampling() = ToProto(spec_.sampling);
  AddSiblings(request.mutable_siblings());
  StreamReader<WorkerGenerateRequest, TokenEvent>::Start(
      context, std::move(request),
      [stub](auto* c, auto* r, auto* x) { stub->async()->Generate(c, r, x); },
      [self = shared_from_this()](const TokenEvent& e) { self->OnTokenEvent(e); },
      [self = shared_from_this()](const grpc::Status& s) { self->OnDecodeDone(s); });
}

void RequestFlow::OnTokenEvent(const TokenEvent& event) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    MergeTimings(event.timings());
    if (event.num_cached_tokens() > 0) cached_tokens_ = event.num_cached_tokens();
    const int j = event.sequence();
    if (j < 0 || j >= static_cast<int>(sequences_.size())) {
      Fail(absl::InternalError(absl::StrCat("worker '", decode_->id, "' sent sequence ", j, " of ",
                                            sequences_.size())),
           later);
    } else if (event.finish_reason() == tandem::v1::FINISH_REASON_ERROR) {
      Fail(absl::UnavailableError(absl::StrCat("worker '", decode_->id,
                                               "' failed the request: ", event.error_message())),
           later);
    } else if (sequences_[j]->sink != nullptr) {  // else: ended here (a stop string) already
      EmitTokens(j, event.token_ids(), event.logprobs(), later, &event.prompt_logprobs());
      if (phase_ != Phase::kDone && sequences_[j]->sink != nullptr &&
          event.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
        // The last live sequence: the worker finished the request and freed its pages.
        if (live_sequences_ == 1) abort_decode_.reset();
        FinishSequence(j, event.finish_reason(), /*router_ended=*/false, later);
      }
    }
  }
  Run(later);
}

void RequestFlow::OnDecodeDone(const grpc::Status& status) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    const WorkerRef decode = abort_decode_.value_or(decode_.value_or(WorkerRef{}));
    // As for the prefill worker (request_flow.cc): a decode worker that reports the prefill
    // worker's transfer failed is not unreachable.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !decode.id.empty() &&
        !(decode_ctx_ && ReportsPeerFault(*decode_ctx_))) {
      later.push_back(
          [this, decode] { deps_->registry->ReportUnreachable(decode.id, decode.epoch); });
    }
    if (phase_ != Phase::kDone) {
      if (!status.ok()) {
        Fail(WorkerCallError(status, decode.id, mixed_ ? "Generate" : "GenerateFromPrefill"),
             later);
      } else {
        Fail(absl::UnavailableError(absl::StrCat("worker '", decode.id,
                                                 "' ended the stream without a terminal event")),
             later);
      }
    }
  }
  Run(later);
}

void RequestFlow::RejectWaiting(const absl::Status& status) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone || admitted_) return;
    std::vector<std::shared_ptr<GenerationSink>> sinks = TakeLiveSinks();
    EndCommon("error", tandem::v1::ABORT_REASON_CLIENT_CANCELLED, later);
    for (const auto& sink : sinks) sink->OnError(status);
  }
  Run(later);
}

void RequestFlow::Cancel() {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    if (!admitted_ && deps_->admission->CancelWaiting(ticket_)) {
      // Never started: nothing to abort, no slot to release.
      std::vector<std::shared_ptr<GenerationSink>> sinks = TakeLiveSinks();
      EndCommon("abort", tandem::v1::ABORT_REASON_CLIENT_CANCELLED, later);
      for (const auto& sink : sinks) {
        sink->OnError(absl::CancelledError("the client cancelled the request"));
      }
    } else {
      Fail(absl::CancelledError("the client cancelled the request"), later);
    }
  }
  Run(later);
}

void RequestFlow::OnWorkerDown(const std::string& worker_id, uint64_t epoch) {
  Actions later;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDone) return;
    auto is = [&](const std::optional<WorkerRef>& ref) {
      return ref && ref->id == worker_id && ref->epoch == epoch;
    };
    const bool prefill_matters = is(prefill_) && !prefill_stream_done_;
    if (prefill_matters || is(decode_) || is(abort_decode_)) {
      Fail(absl::UnavailableError(
               absl::StrCat("worker '", worker_id, "' went down while serving the request")),
           later);
    }
  }
  Run(later);
}

}  // namespace tandem::router
