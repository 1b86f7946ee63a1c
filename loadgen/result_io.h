// Result output in the shapes of `vllm bench serve`: the printed "Serving Benchmark Result"
// block, the result JSON (same keys, plus documented extras) and a CSV summary row.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loadgen/metrics.h"
#include "loadgen/request_record.h"

namespace tandem::loadgen {

// What the run was (the JSON's configuration keys).
struct RunContext {
  std::string backend = "openai";
  std::string label;  // defaults to the backend
  std::string model_id;
  std::string tokenizer_id;
  std::string dataset_name = "random";
  int num_prompts = 0;
  double request_rate = 0;  // +inf: all at t = 0
  double burstiness = 1.0;
  int max_concurrency = 0;  // 0: none
  uint64_t seed = 0;        // the seed of the run's prompts and arrivals (a sweep point's own)
  std::map<std::string, std::string> metadata;  // --metadata KEY=VALUE
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};
  std::string sweep_variable;  // "rate" / "concurrency" for sweep points, else ""
  double sweep_value = 0;
  bool interrupted = false;
  int not_sent = 0;
};

// Parses "--percentile-metrics ttft,tpot,itl" / "--metric-percentiles 25,50,99.9".
absl::Status ParsePercentileMetrics(const std::string& text, std::vector<std::string>* out);
absl::Status ParseMetricPercentiles(const std::string& text, std::vector<double>* out);

// vLLM's "p99" / "p99.9" spelling of a percentile.
std::string PercentileWord(double p);

void PrintResultBlock(const Metrics& m, const RunContext& ctx, std::FILE* out);

// The result JSON; `detailed` adds per-request arrays (input_lens, output_lens, ttfts, itls,
// latencies, start_times, queue_times, errors, and generated_texts when kept).
nlohmann::json ResultJson(const Metrics& m, const RunContext& ctx,
                          const std::vector<RequestRecord>& records, bool detailed);

// CSV summary: a header and one row per result JSON.
std::string CsvHeader();
std::string CsvRow(const nlohmann::json& result);

// vLLM's default file name: {label}-{rate}qps[-concurrency{N}]-{model}-{YYYYMMDD-HHMMSS}.json
std::string DefaultResultFilename(const RunContext& ctx, const std::string& timestamp);
std::string NowTimestamp();  // YYYYMMDD-HHMMSS, local time

absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace tandem::loadgen
