#include "router/generation_service.h"

#include "absl/strings/str_cat.h"
#include "base/secure_random.h"
#include "router/routing_policy.h"
#include "router/worker_proto.h"

namespace tandem::router {

int64_t KvTokenCapacity(const std::vector<WorkerSnapshot>& workers) {
  int64_t tokens = 0;
  for (const WorkerSnapshot& w : workers) {
    if (!w.healthy || w.draining) continue;
    if (w.role != tandem::v1::WORKER_ROLE_DECODE && w.role != tandem::v1::WORKER_ROLE_MIXED) {
      continue;
    }
    // The heartbeat's count, else the registration's (before the first heartbeat).
    const int64_t pages =
        w.load.num_pages_total() > 0 ? w.load.num_pages_total() : w.kv_pool.num_pages();
    tokens += pages * w.kv_pool.page_size();
  }
  return tokens;
}

absl::Status CheckWorkerMessageSize(const GenerateSpec& spec) {
  // What the largest worker call (Prefill / Generate) carries: the prompt and the sampling
  // parameters, varints of at most 5 bytes per token id, plus ids and framing.
  const int64_t bytes = static_cast<int64_t>(spec.prompt_tokens.size()) * 5 +
                        static_cast<int64_t>(ToProto(spec.sampling).ByteSizeLong()) + 1024;
  if (bytes <= kMaxWorkerMessageBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("the request is too large to pass to a worker: about ", bytes,
                   " bytes of prompt and sampling parameters, more than the limit of ",
                   kMaxWorkerMessageBytes, " bytes (fewer prompt tokens or stop_token_ids)"));
}

GenerationService::GenerationService(FlowOptions options, const Tokenizer* tokenizer,
                                     WorkerRegistry* registry, RoutingPolicy* policy,
                                     AdmissionController* admission, RouterMetrics* metrics)
    : timers_(options.clock) {
  deps_.options = options;
  deps_.tokenizer = tokenizer;
  deps_.registry = registry;
  deps_.policy = policy;
  deps_.admission = admission;
  deps_.metrics = metrics;
  deps_.timers = &timers_;
  deps_.on_done = [this](const std::string& id) {
    absl::MutexLock lock(&mu_);
    live_.erase(id);
  };
  registry->SetDownListener(
      [this](const std::string& worker_id, uint64_t epoch) { OnWorkerDown(worker_id, epoch); });
  const absl::Duration period = registry->options().heartbeat_interval / 2;
  timers_.RunEvery(period, [registry, admission, clock = options.clock] {
    registry->ExpireStale(clock->Now());
    admission->SetCapacity(KvTokenCapacity(registry->Snapshot()));
    admission->ExpireWaiting();
  });
}

GenerationService::~GenerationService() {
  deps_.registry->SetDownListener(nullptr);
  CancelAll();
  WaitForFlows(absl::Seconds(5));
}

void GenerationService::CancelAll() {
  std::vector<std::shared_ptr<RequestFlow>> flows;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, flow] : live_) flows.push_back(flow);
  }
  for (auto& flow : flows) flow->Cancel();
}

bool GenerationService::AwaitIdle(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_.empty(); };
  return deps_.options.clock->AwaitWithTimeout(&mu_, absl::Condition(&idle), timeout);
}

bool GenerationService::WaitForFlows(absl::Duration timeout) {
  Clock* real = Clock::Real();  // flow_objects has no notification: poll it
  const absl::Time deadline = real->Now() + timeout;
  while (deps_.flow_objects.load() > 0) {
    if (real->Now() >= deadline) return false;
    real->SleepFor(absl::Milliseconds(5));
  }
  return true;
}

absl::StatusOr<std::shared_ptr<RequestHandle>> GenerationService::Submit(
    GenerateSpec spec, std::shared_ptr<GenerationSink> sink) {
  std::vector<std::shared_ptr<GenerationSink>> sinks;
  sinks.push_back(std::move(sink));
  return Submit(std::move(spec), std::move(sinks));
}

absl::StatusOr<std::shared_ptr<RequestHandle>> GenerationService::Submit(
    GenerateSpec spec, std::vector<std::shared_ptr<GenerationSink>> sinks) {
  if (sinks.empty()) return absl::InvalidArgumentError("a request needs at least one sequence");
  if (draining_) {
    deps_.metrics->CountRejected("draining");
    return absl::UnavailableError("the server is shutting down");
  }
  const std::vector<WorkerSnapshot> workers = deps_.registry->Snapshot();
  if (!router::HasUsableWorkers(workers)) {
    deps_.metrics->CountRejected("no_worker");
    return absl::UnavailableError(
        "no healthy worker is registered (need a prefill and a decode worker, or a mixed "
        "worker); retry later");
  }
  if (absl::Status fits = CheckWorkerMessageSize(spec); !fits.ok()) {
    deps_.metrics->CountRejected("invalid");
    return fits;
  }
  // Every sequence's output; the prompt's KV once (siblings share it).
  const int64_t kv_tokens = static_cast<int64_t>(spec.prompt_tokens.size()) +
                            static_cast<int64_t>(sinks.size()) * spec.sampling.max_tokens;
  // Worker-side ids are ours (client-chosen ids may collide), and random 128-bit values: one
  // cannot be guessed to abort another user's request.
  const std::string worker_id = "r" + RandomHex(16);
  auto flow = std::make_shared<RequestFlow>(&deps_, std::move(spec), worker_id, std::move(sinks));
  {
    absl::MutexLock lock(&mu_);
    live_[worker_id] = flow;
  }
  deps_.admission->SetCapacity(KvTokenCapacity(workers));  // also refreshed by the timer
  const uint64_t ticket = next_ticket_++;
  flow->SetTicket(ticket);
  absl::Status admitted = deps_.admission->Admit(
      ticket, [flow] { flow->Start(); },
      [flow, metrics = deps_.metrics](const absl::Status& status) {
        metrics->CountRejected("queue_time");
        flow->RejectWaiting(status);
      },
      kv_tokens);
  if (!admitted.ok()) {
    deps_.metrics->CountRejected("queue_full");
    absl::MutexLock lock(&mu_);
    live_.erase(worker_id);
    return admitted;
  }
  return std::shared_ptr<RequestHandle>(flow);
}

bool GenerationService::HasUsableWorkers() const {
  return !draining_ && router::HasUsableWorkers(deps_.registry->Snapshot());
}

int GenerationService::num_live() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(live_.size());
}

void GenerationService::UpdateGauges() {
  deps_.metrics->running().Set(deps_.admission->running());
  deps_.metrics->waiting().Set(deps_.admission->waiting());
}

void GenerationService::OnWorkerDown(const std::string& worker_id, uint64_t epoch) {
  std::vector<std::shared_ptr<RequestFlow>> flows;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, flow] : live_) flows.push_back(flow);
  }
  for (auto& flow : flows) flow->OnWorkerDown(worker_id, epoch);
}

}  // namespace tandem::router
