// RouterMetrics: the router's Prometheus metrics (prometheus-cpp core), served on the HTTP
// front end's /metrics. Every series carries the constant label model_name (vLLM's label).
//
// Request-level series use vLLM V1's names under the `tandem:` prefix (vLLM's `vllm:`, SGLang's
// `sglang:`): a vLLM dashboard reads them after replacing the prefix. The router is their only
// source — each request is counted once, here, however many workers it passed through:
//   tandem:request_success_total{finished_reason=stop|length|abort|error}
//   tandem:prompt_tokens_total, tandem:generation_tokens_total                    (counters)
//   tandem:request_prompt_tokens, tandem:request_generation_tokens        (histograms, tokens)
//   tandem:time_to_first_token_seconds, tandem:inter_token_latency_seconds,
//   tandem:request_time_per_output_token_seconds, tandem:e2e_request_latency_seconds,
//   tandem:request_queue_time_seconds (router queue + prefill worker queue),
//   tandem:request_prefill_time_seconds (worker-reported), tandem:request_decode_time_seconds
// tandem-only series (no vLLM counterpart): the disaggregation phases and the router itself:
//   tandem_router_queue_time_seconds, tandem_prefill_queue_time_seconds (the two parts of the
//   queue time), tandem_kv_transfer_time_seconds, tandem_first_decode_step_seconds (histograms),
//   tandem_kv_transfer_bytes_total, tandem_requests_rejected_total{reason},
//   tandem_router_requests_running, tandem_router_requests_waiting (admission gauges),
//   tandem_router_workers{role, state=healthy|down} (gauge, refreshed on scrape),
//   tandem_router_http_responses_total{code}
// Engine state (running batch, KV usage, preemptions) comes from the workers
// (worker/worker_metrics.h). Thread-safe (prometheus-cpp metrics are atomic).
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

// What one request that reached a worker leaves in the request-level histograms.
struct FinishedRequest {
  int prompt_tokens = 0;
  int generation_tokens = 0;
  double e2e_s = 0;
  double queue_s = 0;          // router queue + prefill worker queue
  double router_queue_s = 0;   // the router's admission queue alone
  double prefill_queue_s = 0;  // worker-reported; 0 = not reported
  double prefill_s = 0;        // worker-reported; 0 = not reported
  double decode_s = 0;         // first token to last token (router clock)
  double kv_transfer_s = 0;    // worker-reported; 0 = not reported
  double first_decode_step_s = 0;
  int64_t kv_transfer_bytes = 0;
};

// The finished_reason values of tandem:request_success_total (each exported from the start).
inline constexpr const char* kFinishedReasons[] = {"stop", "length", "abort", "error"};

class RouterMetrics {
 public:
  // max_model_len bounds the token histograms' buckets (vLLM's 1-2-5 series up to it).
  explicit RouterMetrics(const std::string& model_name = "", int max_model_len = 0);

  void CountOutcome(std::string_view finished_reason);  // one of kFinishedReasons
  void CountRejected(std::string_view reason);          // "queue_full", "no_worker", ...
  void CountHttpResponse(int status);
  // A request that ran: the request-level histograms and counters of its end.
  void ObserveFinished(const FinishedRequest& r);

  prometheus::Counter& prompt_tokens() { return *prompt_tokens_; }
  prometheus::Counter& generation_tokens() { return *generation_tokens_; }
  prometheus::Histogram& ttft() { return *ttft_; }
  prometheus::Histogram& itl() { return *itl_; }
  prometheus::Histogram& e2e() { return *e2e_; }
  prometheus::Gauge& running() { return *running_; }
  prometheus::Gauge& waiting() { return *waiting_; }

  // Refreshes the worker gauges from the registry, then renders the text exposition format.
  std::string Render(const WorkerRegistry& registry);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Labels labels_;  // {model_name}, on every family
  prometheus::Family<prometheus::Counter>* outcomes_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Family<prometheus::Counter>* http_responses_;
  prometheus::Family<prometheus::Gauge>* workers_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* kv_transfer_bytes_;
  prometheus::Histogram* request_prompt_tokens_;
  prometheus::Histogram* request_generation_tokens_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* tpot_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* router_queue_time_;
  prometheus::Histogram* prefill_queue_time_;
  prometheus::Histogram* prefill_time_;
  prometheus::Histogram* decode_time_;
  prometheus::Histogram* kv_transfer_time_;
  prometheus::Histogram* first_decode_step_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
};

}  // namespace tandem::router
