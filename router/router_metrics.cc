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

Histogram* AddHistogram(prometheus::Registry& registry, const std::string& name,
                        const std::string& help) {
  auto& family = prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
  return &family.Add({}, LatencyBuckets());
}

prometheus::Counter* AddCounter(prometheus::Registry& registry, const std::string& name,
                                const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

prometheus::Gauge* AddGauge(prometheus::Registry& registry, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

RouterMetrics::RouterMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::Registry& r = *registry_;
  outcomes_ = &prometheus::BuildCounter()
                   .Name("tandem_requests_total")
                   .Help("Requests that ended, by outcome (stop, length, abort, error)")
                   .Register(r);
  rejected_ = &prometheus::BuildCounter()
                   .Name("tandem_requests_rejected_total")
                   .Help("Requests refused before running, by reason")
                   .Register(r);
  http_responses_ = &prometheus::BuildCounter()
                         .Name("tandem_router_http_responses_total")
                         .Help("HTTP responses by status code")
                         .Register(r);
  workers_ = &prometheus::BuildGauge()
                  .Name("tandem_router_workers")
                  .Help("Registered workers by role and state")
                  .Register(r);
  prompt_tokens_ = AddCounter(r, "tandem_prompt_tokens_total", "Prompt tokens of started requests");
  generation_tokens_ =
      AddCounter(r, "tandem_generation_tokens_total", "Tokens generated and sent to clients");
  kv_transfer_bytes_ =
      AddCounter(r, "tandem_kv_transfer_bytes_total", "KV bytes moved from prefill to decode");
  ttft_ = AddHistogram(r, "tandem_time_to_first_token_seconds",
                       "Arrival at the router to the first token sent");
  itl_ = AddHistogram(r, "tandem_inter_token_latency_seconds", "Time between streamed tokens");
  e2e_ = AddHistogram(r, "tandem_e2e_request_latency_seconds", "Arrival to the terminal event");
  queue_time_ =
      AddHistogram(r, "tandem_request_queue_time_seconds", "Time in the router's admission queue");
  prefill_queue_time_ = AddHistogram(r, "tandem_prefill_queue_time_seconds",
                                     "Time in the prefill worker's queue (worker-reported)");
  prefill_time_ = AddHistogram(r, "tandem_request_prefill_time_seconds",
                               "Prompt compute on the prefill worker (worker-reported)");
  kv_transfer_time_ = AddHistogram(r, "tandem_kv_transfer_time_seconds",
                                   "KV transfer prefill -> decode (worker-reported)");
  first_decode_step_ =
      AddHistogram(r, "tandem_first_decode_step_seconds",
                   "Joining the decode batch to the second token (worker-reported)");
  running_ = AddGauge(r, "tandem_num_requests_running", "Requests routed to workers");
  waiting_ = AddGauge(r, "tandem_num_requests_waiting", "Requests in the admission queue");
}

void RouterMetrics::CountOutcome(std::string_view outcome) {
  outcomes_->Add({{"outcome", std::string(outcome)}}).Increment();
}

void RouterMetrics::CountRejected(std::string_view reason) {
  rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void RouterMetrics::CountHttpResponse(int status) {
  http_responses_->Add({{"code", std::to_string(status)}}).Increment();
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
