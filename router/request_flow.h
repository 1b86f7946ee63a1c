// RequestFlow: one admitted request's path through the workers (docs/architecture.md §2), as a
// state machine driven by gRPC callbacks:
//
//   Start → Route ─┬─ pair:  decode.ReservePages → prefill.Prefill (stream: first token at once,
//                  │         then transfer_done) → decode.GenerateFromPrefill (stream of tokens)
//                  └─ mixed: worker.Generate (stream of tokens)
//
// A reservation refused with RESOURCE_EXHAUSTED is retried on another decode worker (or the same
// one after a back-off) until the retry budget runs out; a worker found unreachable before any
// token was sent is reported to the registry and the request is routed again. Tokens are
// detokenized here and stop strings applied (TextStream: the workers know tokens only), over the
// whole stream, the prefill worker's first token included; a stop string ends the flow with
// "stop" and aborts the workers still holding the request, which frees its pages. Every flow
// ends in exactly one sink terminal call; on any ending it releases its admission slot once,
// aborts the workers that may still hold state, and cancels its open streams.
//
// Threading: all state is guarded by mu_; sink calls are made under mu_ (serialized); calls that
// may re-enter flows (registry reports, admission release, worker aborts) run after mu_ is
// released.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "router/admission.h"
#include "router/generate_spec.h"
#include "router/generation_sink.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/timer_thread.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tokenizer/text_stream.h"

namespace tandem::router {

struct FlowOptions {
  absl::Duration rpc_timeout = absl::Seconds(5);            // unary worker calls
  absl::Duration reserve_retry_budget = absl::Seconds(30);  // KV pages busy everywhere
  int reservation_ttl_ms = 30000;
  int max_route_attempts = 3;  // routing again after an unreachable worker
  // Arrival, TTFT / ITL / e2e timings, the retry budget and retry delays; outlives the flows.
  Clock* clock = Clock::Real();
};

// Shared services a flow uses; owned by GenerationService, outlive every flow.
struct FlowDeps {
  FlowOptions options;
  const Tokenizer* tokenizer = nullptr;
  WorkerRegistry* registry = nullptr;
  RoutingPolicy* policy = nullptr;
  AdmissionController* admission = nullptr;
  RouterMetrics* metrics = nullptr;
  TimerThread* timers = nullptr;
  std::function<void(const std::string& worker_request_id)> on_done;  // flow ended
  std::atomic<int> flow_objects{0};  // RequestFlow objects alive (for a clean shutdown)
};

class RequestFlow : public RequestHandle, public std::enable_shared_from_this<RequestFlow> {
 public:
  // `worker_request_id` names the request on the workers (unique among live requests).
  RequestFlow(FlowDeps* deps, GenerateSpec spec, std::string worker_request_id,
              std::shared_ptr<GenerationSink> sink);
  ~RequestFlow() override;

  void SetTicket(uint64_t ticket);
  // Admitted: route and start calling workers.
  void Start();
  void Cancel() override;
  // The admission queue gave up on it (waited too long): the sink gets `status`.
  void RejectWaiting(const absl::Status& status);
  // The registry marked a worker down; fails this flow if it depends on it.
  void OnWorkerDown(const std::string& worker_id, uint64_t epoch);

  const std::string& worker_request_id() const { return worker_request_id_; }

 private:
  using Actions = std::vector<std::function<void()>>;
  enum class Phase { kQueued, kRouting, kReserving, kPrefilling, kDecoding, kDone };

  void Route();
  void Reserve(const RoutePlan& plan);
  // `decode`: the worker the ReservePages went to (the flow's abort_decode_ is reset when it
  // ends, so a reservation answered after a cancel is released through this one).
  void OnReserved(const WorkerRef& decode, const grpc::Status& status,
                  const tandem::v1::ReservePagesResponse& response);
  void StartPrefill(const tandem::v1::ReservePagesResponse& reservation);
  void OnPrefillEvent(const tandem::v1::PrefillEvent& event);
  void OnPrefillDone(const grpc::Status& status);
  void StartDecode(Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartMixed(const RoutePlan& plan);
  void OnTokenEvent(const tandem::v1::TokenEvent& event);
  void OnDecodeDone(const grpc::Status& status);
  // Retry routing after a refusal or an unreachable worker; false when out of attempts/budget.
  bool RetryRoute(absl::Duration delay, Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Output and endings (all under mu_; they append work for after the unlock to `later`).
  // `logprobs`: one per id, or empty when the request asked for none.
  void EmitTokens(const google::protobuf::RepeatedField<int32_t>& ids,
                  const google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>& logprobs,
                  Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TokenLogprob LogprobOf(int32_t id, float logprob) const;
  void Finish(tandem::v1::FinishReason reason, Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(absl::Status status, Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndCommon(const char* outcome, tandem::v1::AbortReason abort_reason, Actions& later)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MergeTimings(const tandem::v1::PhaseTimings& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseWorker(std::optional<WorkerRef>& ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendAbort(const WorkerRef& ref, tandem::v1::AbortReason reason);
  static void Run(Actions& later);

  FlowDeps* const deps_;
  const GenerateSpec spec_;
  const std::string worker_request_id_;
  const absl::Time arrival_;

  absl::Mutex mu_;
  std::shared_ptr<GenerationSink> sink_ ABSL_GUARDED_BY(mu_);
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kQueued;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;
  int route_attempts_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time reserve_deadline_ ABSL_GUARDED_BY(mu_);
  RouteQuery query_ ABSL_GUARDED_BY(mu_);
  // Workers this flow occupies (router-side outstanding count) / may hold state on.
  std::optional<WorkerRef> prefill_ ABSL_GUARDED_BY(mu_);
  std::optional<WorkerRef> decode_ ABSL_GUARDED_BY(mu_);
  std::optional<WorkerRef> abort_prefill_ ABSL_GUARDED_BY(mu_);
  std::optional<WorkerRef> abort_decode_ ABSL_GUARDED_BY(mu_);
  bool mixed_ ABSL_GUARDED_BY(mu_) = false;
  bool prefill_stream_done_ ABSL_GUARDED_BY(mu_) = false;
  int32_t first_token_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<grpc::ClientContext> prefill_ctx_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<grpc::ClientContext> decode_ctx_ ABSL_GUARDED_BY(mu_);

  TextStream text_ ABSL_GUARDED_BY(mu_);
  int completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t last_token_ ABSL_GUARDED_BY(mu_) = -1;
  int cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time admitted_at_ ABSL_GUARDED_BY(mu_);
  absl::Time first_token_at_ ABSL_GUARDED_BY(mu_);
  absl::Time last_token_at_ ABSL_GUARDED_BY(mu_);
  tandem::v1::PhaseTimings timings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
