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
// Sequences (n / best_of): a flow may run several sequences of its prompt, one sink each. The
// workers get one request with the others as siblings (worker.proto, "Sibling sequences"): the
// prompt is prefilled once and the siblings fork from its KV — disaggregated on the decode
// worker (the prefill worker keeps the KV for them even if sequence 0 ends at its first
// token), mixed on the mixed worker. Token events name their sequence; each sequence has its
// own text stream and stop strings (a stop string aborts that sequence on the worker only) and
// its own terminal call. A failure fails every sequence still live. Sequence j samples with the
// request's seed + j and is named "<worker id>-<j>" on the workers (j > 0).
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
  // One sink per sequence (at least one).
  RequestFlow(FlowDeps* deps, GenerateSpec spec, std::string worker_request_id,
              std::vector<std::shared_ptr<GenerationSink>> sinks);
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
  // One sequence's output side.
  struct Sequence {
    Sequence(const Tokenizer* tokenizer, const SamplingSpec& s, std::shared_ptr<GenerationSink> k)
        : sink(std::move(k)),
          text(tokenizer, s.skip_special_tokens, s.stop, s.include_stop_str_in_output) {}
    std::shared_ptr<GenerationSink> sink;  // null once it ended
    TextStream text;
    int completion_tokens = 0;
    int32_t last_token = -1;
    double ttft_s = 0;
    absl::Time first_token_at;
    absl::Time last_token_at;
  };
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
  // `prompt_logprobs`: what the event carried (the first token's event of a request that asked:
  // one per prompt token after the first); kept for the request, and given to each sequence
  // with its first token.
  void EmitTokens(int sequence, const google::protobuf::RepeatedField<int32_t>& ids,
                  const google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>& logprobs,
                  Actions& later,
                  const google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>*
                      prompt_logprobs = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  TokenLogprob LogprobOf(int32_t id, float logprob) const;
  // Ends sequence `sequence` with `reason`; the flow ends with its last one. `router_ended`: the
  // router ended it (a stop string), so a worker streaming it is told to abort it.
  void FinishSequence(int sequence, tandem::v1::FinishReason reason, bool router_ended,
                      Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The siblings' worker-side ids and seeds (sequences 1..).
  void AddSiblings(google::protobuf::RepeatedPtrField<tandem::v1::SiblingSequence>* out) const;
  void SendAbortSequence(const WorkerRef& ref, int sequence);
  void Fail(absl::Status status, Actions& later) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sinks of the sequences still live, taken from them (they get their terminal call next).
  std::vector<std::shared_ptr<GenerationSink>> TakeLiveSinks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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

  std::vector<std::unique_ptr<Sequence>> sequences_ ABSL_GUARDED_BY(mu_);
  int live_sequences_ ABSL_GUARDED_BY(mu_) = 0;
  int cached_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // spec_.sampling.prompt_logprobs >= 0: the prompt's logprobs, once a worker sent them.
  std::optional<std::vector<TokenLogprobInfo>> prompt_logprobs_ ABSL_GUARDED_BY(mu_);
  absl::Time admitted_at_ ABSL_GUARDED_BY(mu_);
  tandem::v1::PhaseTimings timings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::router
