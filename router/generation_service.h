// GenerationService: the front ends' single entry point. Submit() rejects what cannot run now
// (no usable worker → Unavailable; admission queue full → ResourceExhausted; worker calls over
// gRPC's message limit → InvalidArgument) and otherwise
// queues the request behind the admission controller and runs it as a RequestFlow, which ends
// with exactly one terminal call on the sink. Also fails the flows on a worker that goes down,
// and runs the registry's heartbeat-expiry check. Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "router/admission.h"
#include "router/generate_spec.h"
#include "router/generation_sink.h"
#include "router/request_flow.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/timer_thread.h"
#include "router/worker_registry.h"
#include "tokenizer/tokenizer.h"

namespace tandem::router {

// gRPC's default limit on a received message (the workers' servers keep it): a worker call
// larger than this would fail at the worker, so Submit refuses it as a client error.
inline constexpr int64_t kMaxWorkerMessageBytes = 4 << 20;

// The KV tokens the healthy, non-draining decode and mixed workers can hold (admission.h).
int64_t KvTokenCapacity(const std::vector<WorkerSnapshot>& workers);
// InvalidArgument if the worker calls of `spec` would exceed kMaxWorkerMessageBytes.
absl::Status CheckWorkerMessageSize(const GenerateSpec& spec);

class GenerationService {
 public:
  // All pointers are borrowed and must outlive the service.
  GenerationService(FlowOptions options, const Tokenizer* tokenizer, WorkerRegistry* registry,
                    RoutingPolicy* policy, AdmissionController* admission, RouterMetrics* metrics);
  ~GenerationService();

  // On OK the sink will get exactly one terminal call; the handle cancels the request.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(GenerateSpec spec,
                                                        std::shared_ptr<GenerationSink> sink);
  // Several sequences of one prompt (n / best_of), one sink each: one request to the workers,
  // which prefill the prompt once and fork the others from its KV (RequestFlow). Sequence j
  // samples with the spec's seed + j (when it has one). Each sink gets its terminal call.
  absl::StatusOr<std::shared_ptr<RequestHandle>> Submit(
      GenerateSpec spec, std::vector<std::shared_ptr<GenerationSink>> sinks);

  // True when a (prefill, decode) pair or a mixed worker is healthy: /ready, and 503 at submit.
  bool HasUsableWorkers() const;
  int num_live() const;

  // Runs `fn` soon on the service's timer thread (work a sink call must not do inline).
  void RunSoon(std::function<void()> fn) { timers_.RunAfter(absl::ZeroDuration(), std::move(fn)); }

  // Refreshes the running/waiting gauges (call before rendering /metrics).
  void UpdateGauges();

  // While draining, Submit refuses new requests (Unavailable) and /ready says 503.
  void SetDraining(bool draining) { draining_ = draining; }
  bool draining() const { return draining_; }
  // Cancels every live request.
  void CancelAll();
  // Waits until no request is live, up to `timeout` on the flows' clock; false on timeout.
  bool AwaitIdle(absl::Duration timeout);
  // Waits until no RequestFlow object is left (gRPC callbacks hold them a little longer than
  // their terminal event); false on timeout. Real time: it waits for gRPC, not for a policy.
  bool WaitForFlows(absl::Duration timeout);

 private:
  void OnWorkerDown(const std::string& worker_id, uint64_t epoch);

  FlowDeps deps_;
  std::atomic<uint64_t> next_ticket_{1};  // admission tickets
  std::atomic<bool> draining_{false};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<RequestFlow>> live_ ABSL_GUARDED_BY(mu_);
  TimerThread timers_;  // last: stops before the members its callbacks use go away
};

}  // namespace tandem::router
