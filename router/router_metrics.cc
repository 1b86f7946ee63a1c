#include "router/router_metrics.h"

#include <map>
#include <sstream>

#include "prometheus/text_serializer.h"

namespace tandem::router {
namespace {

using prometheus::Histogram;

// Latency buckets (seconds) from 1 ms to 5 min, roughly x2.5 apart.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.25,  0.5,  0.75,
          1.0,   2.5,    5.0,   7.5,  10.0,  20.0, 40.0,  80.0, 160.0, 300.0};
}

// Per-token latency buckets (seconds): 1 ms to 5 s.
Histogram::BucketBoundaries TokenLatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
          0.075, 0.1,    0.15,  0.2,    0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0};
}

// Token-count buckets: 1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's 1-2-5 series);
// without a known context length, up to 1M.
Histogram::BucketBoundaries TokenCountBuckets(int max_model_len) {
  const double limit = max_model_len > 0 ? max_model_len : 1 << 20;
  Histogram::BucketBoundaries b;
  for (double decade = 1;; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * decade > limit) return b;
      b.push_back(m * decade);
    }
  }
}

void ObserveIfSet(Histogram& histogram, double seconds) {
  if (seconds > 0) histogram.Observe(seconds);
}

}  // namespace

RouterMetrics::RouterMetrics(const std::string& model_name, int max_model_len)
    : registry_(std::make_shared<prometheus::Registry>()), labels_{{"model_name", model_name}} {
  prometheus::Registry& r = *registry_;
  auto counters = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Labels(labels_).Register(r);
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &counters(name, help)->Add({});
  };
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Labels(labels_).Register(r).Add({});
  };
  auto histogram = [&](const std::string& name, const std::string& help,
                       const Histogram::BucketBoundaries& buckets) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Labels(labels_).Register(r).Add(
        {}, buckets);
  };
  const Histogram::BucketBoundaries latency = LatencyBuckets();
  const Histogram::BucketBoundaries per_token = TokenLatencyBuckets();
  const Histogram::BucketBoundaries tokens = TokenCountBuckets(max_model_len);

  outcomes_ = counters("tandem:request_success_total",
                       "Requests that ended after being admitted, by finished_reason");
  // Every finished_reason is exported from the start, at 0 (as vLLM does): a client that takes
  // the difference between its first and last scrape (aiperf's server metrics) would otherwise
  // miss the requests that created a series after its first scrape.
  for (const char* reason : kFinishedReasons) outcomes_->Add({{"finished_reason", reason}});
  rejected_ =
      counters("tandem_requests_rejected_total", "Requests refused before running, by reason");
  http_responses_ = counters("tandem_router_http_responses_total", "HTTP responses by status code");
  workers_ = &prometheus::BuildGauge()
                  .Name("tandem_router_workers")
                  .Help("Registered workers by role and state")
                  .Labels(labels_)
                  .Register(r);
  prompt_tokens_ = counter("tandem:prompt_tokens_total", "Prompt tokens of admitted requests");
  generation_tokens_ =
      counter("tandem:generation_tokens_total", "Tokens generated and sent to clients");
  kv_transfer_bytes_ =
      counter("tandem_kv_transfer_bytes_total", "KV bytes moved from prefill to decode");
  request_prompt_tokens_ =
      histogram("tandem:request_prompt_tokens", "Prompt tokens per finished request", tokens);
  request_generation_tokens_ = histogram("tandem:request_generation_tokens",
                                         "Generated tokens per finished request", tokens);
  ttft_ = histogram("tandem:time_to_first_token_seconds",
                    "Arrival at the router to the first token sent", latency);
  itl_ = histogram("tandem:inter_token_latency_seconds", "Time between streamed tokens", per_token);
  tpot_ = histogram("tandem:request_time_per_output_token_seconds",
                    "Per request: decode time / (generated tokens - 1)", per_token);
  e2e_ = histogram("tandem:e2e_request_latency_seconds", "Arrival to the terminal event", latency);
  queue_time_ = histogram("tandem:request_queue_time_seconds",
                          "Router admission queue + prefill worker queue", latency);
  router_queue_time_ = histogram("tandem_router_queue_time_seconds",
                                 "Time in the router's admission queue", latency);
  prefill_queue_time_ = histogram("tandem_prefill_queue_time_seconds",
                                  "Time in the prefill worker's queue (worker-reported)", latency);
  prefill_time_ = histogram("tandem:request_prefill_time_seconds",
                            "Prompt compute on the prefill worker (worker-reported)", latency);
  decode_time_ =
      histogram("tandem:request_decode_time_seconds", "First token to last token sent", latency);
  kv_transfer_time_ = histogram("tandem_kv_transfer_time_seconds",
                                "KV transfer prefill -> decode (worker-reported)", latency);
  first_decode_step_ =
      histogram("tandem_first_decode_step_seconds",
                "Joining the decode batch to the second token (worker-reported)", latency);
  running_ = gauge("tandem_router_requests_running", "Requests routed to workers");
  waiting_ = gauge("tandem_router_requests_waiting", "Requests in the admission queue");
}

void RouterMetrics::CountOutcome(std::string_view finished_reason) {
  outcomes_->Add({{"finished_reason", std::string(finished_reason)}}).Increment();
}

void RouterMetrics::CountRejected(std::string_view reason) {
  rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void RouterMetrics::CountHttpResponse(int status) {
  http_responses_->Add({{"code", std::to_string(status)}}).Increment();
}

void RouterMetrics::ObserveFinished(const FinishedRequest& f) {
  request_prompt_tokens_->Observe(f.prompt_tokens);
  request_generation_tokens_->Observe(f.generation_tokens);
  e2e_->Observe(f.e2e_s);
  queue_time_->Observe(f.queue_s);
  router_queue_time_->Observe(f.router_queue_s);
  ObserveIfSet(*prefill_queue_time_, f.prefill_queue_s);
  ObserveIfSet(*prefill_time_, f.prefill_s);
  if (f.generation_tokens > 0) decode_time_->Observe(f.decode_s);
  if (f.generation_tokens > 1) tpot_->Observe(f.decode_s / (f.generation_tokens - 1));
  ObserveIfSet(*kv_transfer_time_, f.kv_transfer_s);
  ObserveIfSet(*first_decode_step_, f.first_decode_step_s);
  kv_transfer_bytes_->Increment(static_cast<double>(f.kv_transfer_bytes));
}

std::string RouterMetrics::Render(const WorkerRegistry& registry) {
  std::map<std::pair<std::string, std::string>, int> counts;
  for (const char* role : {"prefill", "decode", "mixed"}) {
    counts[{role, "healthy"}] = 0;
    counts[{role, "down"}] = 0;
  }
  for (const WorkerSnapshot& w : registry.Snapshot()) {
    std::string role = tandem::v1::WorkerRole_Name(w.role);
    role = role == "WORKER_ROLE_PREFILL"  ? "prefill"
           : role == "WORKER_ROLE_DECODE" ? "decode"
                                          : "mixed";
    ++counts[{role, w.healthy ? "healthy" : "down"}];
  }
  for (const auto& [key, n] : counts) {
    workers_->Add({{"role", key.first}, {"state", key.second}}).Set(n);
  }
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace tandem::router
