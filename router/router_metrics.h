// RouterMetrics: the router's Prometheus metrics (prometheus-cpp core), served on the HTTP
// front end's /metrics. Base units (seconds, bytes), `_total` counters (Prometheus conventions):
//   tandem_requests_total{outcome=stop|length|abort|error}      requests that ended
//   tandem_requests_rejected_total{reason=...}                   refused before running
//   tandem_prompt_tokens_total, tandem_generation_tokens_total
//   tandem_time_to_first_token_seconds, tandem_inter_token_latency_seconds,
//   tandem_e2e_request_latency_seconds, tandem_request_queue_time_seconds,
//   tandem_prefill_queue_time_seconds, tandem_request_prefill_time_seconds,
//   tandem_kv_transfer_time_seconds, tandem_first_decode_step_seconds   (histograms)
//   tandem_kv_transfer_bytes_total
//   tandem_num_requests_running, tandem_num_requests_waiting     (gauges)
//   tandem_router_workers{role, state=healthy|down}              (gauge, refreshed on scrape)
//   tandem_router_http_responses_total{code}
// Thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "router/worker_registry.h"

namespace tandem::router {

class RouterMetrics {
 public:
  RouterMetrics();

  void CountOutcome(std::string_view outcome);  // "stop", "length", "abort", "error"
  void CountRejected(std::string_view reason);  // "queue_full", "no_worker", "invalid", ...
  void CountHttpResponse(int status);

  prometheus::Counter& prompt_tokens() { return *prompt_tokens_; }
  prometheus::Counter& generation_tokens() { return *generation_tokens_; }
  prometheus::Counter& kv_transfer_bytes() { return *kv_transfer_bytes_; }
  prometheus::Histogram& ttft() { return *ttft_; }
  prometheus::Histogram& itl() { return *itl_; }
  prometheus::Histogram& e2e() { return *e2e_; }
  prometheus::Histogram& queue_time() { return *queue_time_; }
  prometheus::Histogram& prefill_queue_time() { return *prefill_queue_time_; }
  prometheus::Histogram& prefill_time() { return *prefill_time_; }
  prometheus::Histogram& kv_transfer_time() { return *kv_transfer_time_; }
  prometheus::Histogram& first_decode_step() { return *first_decode_step_; }
  prometheus::Gauge& running() { return *running_; }
  prometheus::Gauge& waiting() { return *waiting_; }

  // Refreshes the worker gauges from the registry, then renders the text exposition format.
  std::string Render(const WorkerRegistry& registry);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* outcomes_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Family<prometheus::Counter>* http_responses_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* kv_transfer_bytes_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* prefill_queue_time_;
  prometheus::Histogram* prefill_time_;
  prometheus::Histogram* kv_transfer_time_;
  prometheus::Histogram* first_decode_step_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
};

}  // namespace tandem::router
