// Benchmark metrics with the definitions of `vllm bench serve` (all latencies in ms):
//   TTFT_i   = first token chunk - release time (see benchmark_runner.h)
//   E2EL_i   = last token chunk - release time
//   TPOT_i   = (E2EL_i - TTFT_i) / (n_i - 1), only for requests with n_i > 1 output tokens
//   ITL      = every gap between consecutive token chunks of a request, pooled over requests
//   client_queue_time_i = release - scheduled (time spent waiting for a --max-concurrency slot)
//   e2el_including_client_queue_i = E2EL_i + client_queue_time_i
// Statistics are over successful requests only: mean, median, population std and percentiles
// with linear interpolation (numpy's defaults); an empty set gives 0. Throughputs divide by the
// benchmark duration. Goodput counts requests meeting every given SLO (TPOT counts as 0 when
// n_i <= 1). Peak output tokens/s and peak concurrency use 1-second buckets from the first
// release, as vLLM does.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/request_record.h"

namespace tandem::loadgen {

// --goodput ttft:MS tpot:MS e2el:MS
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
absl::StatusOr<Slo> ParseGoodput(const std::vector<std::string>& items);

struct Distribution {
  size_t count = 0;
  double mean = 0, median = 0, std = 0;
  std::vector<double> percentiles;  // in the order of the requested percentiles
  std::vector<double> cdf;          // the 0th, 1st, ..., 100th percentile (101 values)
};
Distribution Summarize(std::vector<double> values, const std::vector<double>& percentiles);

// Metric names, as in `--percentile-metrics`.
inline constexpr const char* kMetricNames[] = {
    "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"};
// Server-reported TTFT phases, in request-path order; "other" = TTFT minus their sum.
inline constexpr const char* kPhaseNames[] = {"queue", "prefill", "kv_transfer", "first_decode",
                                              "other"};

struct Metrics {
  int completed = 0;
  int failed = 0;
  std::map<std::string, int> failed_by_cause;
  std::vector<std::string> errors;  // the first 10 failure messages
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;
  std::optional<double> request_goodput;  // only with SLOs
  double output_throughput = 0;
  double total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  double max_concurrent_requests = 0;
  std::vector<double> percentiles;
  std::map<std::string, Distribution> dists;   // by kMetricNames
  int phase_requests = 0;                      // successful requests that reported phases
  std::map<std::string, Distribution> phases;  // by kPhaseNames, over phase_requests
  Distribution send_lag;                       // loadgen health: actual send - release (ms)
};

Metrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                       const std::vector<double>& percentiles, const Slo& slo);

}  // namespace tandem::loadgen
