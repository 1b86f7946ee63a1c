// WorkerMetrics: the Prometheus metrics every worker exports on its metrics port (pull model,
// GET /metrics, served by MetricsHttpServer). Constant labels {model_name, role, worker} on every
// family. Two kinds of series (see the README's "Metrics" section):
//   - the engine's own state, vLLM V1's names under `tandem:` — this worker is their only
//     source: tandem:num_requests_running, tandem:num_requests_waiting,
//     tandem:kv_cache_usage_perc (0-1), tandem:num_preemptions_total;
//   - per-worker diagnostics, `tandem_worker_*`: the phases this worker saw (queue, prefill, KV
//     send on a prefill worker / KV receive on a decode worker, first decode step, time held),
//     outcomes, pages, and the engine's token counts. A request appears once on every worker it
//     passed through, so these overlap the router's request-level `tandem:` series by design:
//     they say where time and tokens went, never how many requests or tokens were served.
// Thread-safe (prometheus-cpp metrics are atomic), except UpdateEngine (one caller).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/engine.h"
#include "worker/metrics_http_server.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem {

class WorkerMetrics {
 public:
  // Serves /metrics on host:port (port 0 picks a free one). role: "prefill", "decode" or
  // "mixed" (a prefill worker's KV series are sends, the others' receives). Errors:
  // MetricsHttpServer::Start's (PortTakenError when the port is taken).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& host, int port,
                                                               const std::string& role,
                                                               const std::string& worker_id,
                                                               const std::string& model_name);
  ~WorkerMetrics();

  int port() const { return server_->port(); }
  // The metrics port's /health and /ready (MetricsHttpServer::SetProbes).
  void SetProbes(std::function<absl::Status()> health, std::function<bool()> ready) {
    server_->SetProbes(std::move(health), std::move(ready));
  }

  void ObserveQueueTime(double seconds);
  void ObservePrefillTime(double seconds);
  // `path`: the data path the pages took (KvTransferStats::path: tcp, ipc or nccl), counted in
  // <kv>_transfers_total{path}.
  void ObserveKvTransfer(double seconds, int64_t bytes, const std::string& path = "tcp");
  // Prefill workers: the part of a transfer not hidden behind the prompt's compute (the prompt's
  // result on the host -> the decode worker's acknowledgment; the whole transfer when the pages
  // go after the prefill), tandem_worker_kv_send_exposed_seconds. Other roles: nothing.
  void ObserveKvExposed(double seconds);
  // The configured KV transport (--kv-transport: tcp, ipc, nccl or auto), exported as
  // tandem_worker_kv_transport_info{kv_transport} = 1.
  void SetKvTransport(const std::string& kind);
  // The KV pool (--kv-cache-dtype; pages of page_size tokens), exported as
  // tandem_worker_kv_cache_info{kv_cache_dtype, page_size} = num_pages.
  void SetKvCache(const std::string& kv_cache_dtype, int page_size, int num_pages);
  void CountKvTransferFailure(const std::string& reason);
  void ObserveFirstDecodeStep(double seconds);
  void ObserveRequestDuration(double seconds);
  // Terminal outcome of a request on this worker: "stop", "length", "abort", "error",
  // "prefill_done" (prefill worker handed it to decode).
  void CountRequestOutcome(const std::string& reason);
  // Gauges: engine state and requests this worker holds state for. One caller thread only.
  // output_handling_ns_total: EngineLoop::output_handling_ns_total().
  void UpdateEngine(const EngineStats& stats, int num_live_requests,
                    int64_t output_handling_ns_total = 0);

 private:
  WorkerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> server_;  // serves registry_ (holds a reference to it)
  prometheus::Histogram* queue_time_ = nullptr;
  prometheus::Histogram* prefill_time_ = nullptr;
  prometheus::Histogram* kv_transfer_time_ = nullptr;
  prometheus::Histogram* kv_transfer_bytes_ = nullptr;
  prometheus::Histogram* kv_exposed_ = nullptr;  // prefill role only
  prometheus::Histogram* first_decode_step_ = nullptr;
  prometheus::Histogram* request_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* outcomes_ = nullptr;
  prometheus::Family<prometheus::Counter>* kv_failures_ = nullptr;
  prometheus::Family<prometheus::Counter>* kv_paths_ = nullptr;
  prometheus::Family<prometheus::Gauge>* kv_transport_ = nullptr;
  prometheus::Family<prometheus::Gauge>* kv_cache_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* batches_in_flight_ = nullptr;
  prometheus::Gauge* live_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Counter* preemptions_ = nullptr;
  prometheus::Gauge* pages_free_ = nullptr;
  prometheus::Gauge* pages_reserved_ = nullptr;
  prometheus::Gauge* pages_owned_ = nullptr;
  prometheus::Gauge* pages_cached_ = nullptr;
  prometheus::Counter* prefix_cache_queries_ = nullptr;
  prometheus::Counter* prefix_cache_hits_ = nullptr;
  prometheus::Gauge* prefix_cache_hit_rate_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  // Speculative decoding (vLLM's spec_decode_* names; engine/spec/README.md).
  prometheus::Counter* spec_drafts_ = nullptr;
  prometheus::Counter* spec_draft_tokens_ = nullptr;
  prometheus::Counter* spec_accepted_tokens_ = nullptr;
  prometheus::Counter* spec_emitted_tokens_ = nullptr;
  prometheus::Gauge* spec_acceptance_rate_ = nullptr;
  prometheus::Gauge* spec_mean_accepted_length_ = nullptr;
  prometheus::Gauge* draft_pages_free_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* graph_steps_ = nullptr;
  prometheus::Counter* async_steps_ = nullptr;
  prometheus::Counter* step_seconds_ = nullptr;
  prometheus::Counter* device_wait_seconds_ = nullptr;
  prometheus::Counter* output_seconds_ = nullptr;
  int64_t last_steps_ = 0;
  int64_t last_graph_steps_ = 0;
  int64_t last_async_steps_ = 0;
  int64_t last_step_ns_ = 0;
  int64_t last_device_wait_ns_ = 0;
  int64_t last_output_ns_ = 0;
  int64_t last_spec_drafts_ = 0;
  int64_t last_spec_draft_tokens_ = 0;
  int64_t last_spec_accepted_tokens_ = 0;
  int64_t last_spec_emitted_tokens_ = 0;
  int64_t last_prompt_tokens_ = 0;
  int64_t last_generation_tokens_ = 0;
  int64_t last_preemptions_ = 0;
  int64_t last_prefix_queries_ = 0;
  int64_t last_prefix_hits_ = 0;
};

}  // namespace tandem
