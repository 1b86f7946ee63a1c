// WorkerMetrics: the Prometheus metrics every worker exports on its metrics port (pull model,
// GET /metrics, served by MetricsHttpServer). Names follow the project convention (reference:
// ecosystem-and-reliability.md §4.5): `tandem_` prefix, base units, `_total` counters, constant
// labels {role, worker, model}. Histograms per request phase: queue, prefill, KV transfer (seconds
// and bytes), first decode step, and the worker-side request duration. Thread-safe (prometheus-cpp
// metrics are atomic), except UpdateEngine (one caller).
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
  // Serves /metrics on host:port (port 0 picks a free one). Errors: MetricsHttpServer::Start's
  // (PortTakenError when the port is taken).
  static absl::StatusOr<std::unique_ptr<WorkerMetrics>> Create(const std::string& host, int port,
                                                               const std::string& role,
                                                               const std::string& worker_id,
                                                               const std::string& model);
  ~WorkerMetrics();

  int port() const { return server_->port(); }

  void ObserveQueueTime(double seconds);
  void ObservePrefillTime(double seconds);
  void ObserveKvTransfer(double seconds, int64_t bytes);
  void CountKvTransferFailure(const std::string& reason);
  void ObserveFirstDecodeStep(double seconds);
  void ObserveRequestDuration(double seconds);
  // Terminal outcome of a request on this worker: "stop", "length", "abort", "error",
  // "prefill_done" (prefill worker handed it to decode).
  void CountRequestOutcome(const std::string& reason);
  // Gauges: engine state and requests this worker holds state for. One caller thread only.
  void UpdateEngine(const EngineStats& stats, int num_live_requests);

 private:
  WorkerMetrics() = default;

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsHttpServer> server_;  // serves registry_ (holds a reference to it)
  prometheus::Histogram* queue_time_ = nullptr;
  prometheus::Histogram* prefill_time_ = nullptr;
  prometheus::Histogram* kv_transfer_time_ = nullptr;
  prometheus::Histogram* kv_transfer_bytes_ = nullptr;
  prometheus::Histogram* first_decode_step_ = nullptr;
  prometheus::Histogram* request_duration_ = nullptr;
  prometheus::Family<prometheus::Counter>* outcomes_ = nullptr;
  prometheus::Family<prometheus::Counter>* kv_failures_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* live_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Gauge* pages_free_ = nullptr;
  prometheus::Gauge* pages_reserved_ = nullptr;
  prometheus::Gauge* pages_owned_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  int64_t last_prompt_tokens_ = 0;
  int64_t last_generation_tokens_ = 0;
};

}  // namespace tandem
