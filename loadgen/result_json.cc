// The result JSON and CSV of result_io.h.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "loadgen/result_io.h"

namespace tandem::loadgen {

using nlohmann::json;

namespace {

json ConfigJson(const RunContext& ctx) {
  json j;
  j["date"] = NowTimestamp();
  j["endpoint_type"] = ctx.backend;
  j["backend"] = ctx.backend;
  j["label"] = ctx.label.empty() ? ctx.backend : ctx.label;
  j["model_id"] = ctx.model_id;
  j["tokenizer_id"] = ctx.tokenizer_id;
  j["num_prompts"] = ctx.num_prompts;
  if (std::isfinite(ctx.request_rate)) {
    j["request_rate"] = ctx.request_rate;
  } else {
    j["request_rate"] = "inf";
  }
  j["burstiness"] = ctx.burstiness;
  j["max_concurrency"] = ctx.max_concurrency > 0 ? json(ctx.max_concurrency) : json(nullptr);
  for (const auto& [key, value] : ctx.metadata) j[key] = value;
  return j;
}

// Extras beyond vLLM's keys (documented in loadgen/README.md).
void AddExtras(const Metrics& m, const RunContext& ctx, json* j) {
  (*j)["dataset_name"] = ctx.dataset_name;
  (*j)["seed"] = ctx.seed;
  (*j)["interrupted"] = ctx.interrupted;
  (*j)["not_sent"] = ctx.not_sent;
  (*j)["failed_by_cause"] = m.failed_by_cause;
  (*j)["percentiles"] = m.percentiles;
  if (!ctx.sweep_variable.empty()) {
    (*j)["sweep_variable"] = ctx.sweep_variable;
    (*j)["sweep_value"] = ctx.sweep_value;
  }
  json cdf = json::object();
  for (const char* name : {"ttft", "tpot", "itl", "e2el"}) cdf[name] = m.dists.at(name).cdf;
  (*j)["cdf_ms"] = cdf;  // the 0th..100th percentile of each metric
  json phases = json::object();
  phases["requests"] = m.phase_requests;
  for (const auto& [name, d] : m.phases) {
    phases[absl::StrCat("mean_", name, "_ms")] = d.mean;
    phases[absl::StrCat("median_", name, "_ms")] = d.median;
  }
  (*j)["server_timing"] = phases;
  (*j)["loadgen_send_lag_ms"] = {{"mean", m.send_lag.mean},
                                 {"max", m.send_lag.cdf.empty() ? 0.0 : m.send_lag.cdf.back()}};
}

void AddDetailed(const std::vector<RequestRecord>& records, json* j) {
  json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
       itls = json::array(), latencies = json::array(), starts = json::array(),
       queues = json::array(), texts = json::array(), errors = json::array();
  for (const RequestRecord& r : records) {
    bool ok = r.success && !r.chunk_ns.empty();
    input_lens.push_back(r.prompt_len);
    output_lens.push_back(ok ? r.output_tokens : 0);
    ttfts.push_back(ok ? r.TtftMs() / 1e3 : 0.0);  // seconds, as vLLM
    json itl = json::array();
    for (size_t k = 1; k < r.chunk_ns.size(); ++k) {
      itl.push_back((r.chunk_ns[k] - r.chunk_ns[k - 1]) / 1e9);
    }
    itls.push_back(itl);
    latencies.push_back(ok ? r.E2elMs() / 1e3 : 0.0);
    starts.push_back(r.released_ns / 1e9);
    queues.push_back(r.ClientQueueMs() / 1e3);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
  }
  (*j)["input_lens"] = input_lens;
  (*j)["output_lens"] = output_lens;
  (*j)["ttfts"] = ttfts;
  (*j)["itls"] = itls;
  (*j)["latencies"] = latencies;
  (*j)["start_times"] = starts;
  (*j)["queue_times"] = queues;
  (*j)["generated_texts"] = texts;
  (*j)["errors"] = errors;
}

}  // namespace

json ResultJson(const Metrics& m, const RunContext& ctx, const std::vector<RequestRecord>& records,
                bool detailed) {
  json j = ConfigJson(ctx);
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = m.request_goodput ? json(*m.request_goodput) : json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const std::string& name : ctx.percentile_metrics) {
    const Distribution& d = m.dists.at(name);
    j[absl::StrCat("mean_", name, "_ms")] = d.mean;
    j[absl::StrCat("median_", name, "_ms")] = d.median;
    j[absl::StrCat("std_", name, "_ms")] = d.std;
    for (size_t i = 0; i < m.percentiles.size(); ++i) {
      j[absl::StrCat("p", PercentileWord(m.percentiles[i]), "_", name, "_ms")] = d.percentiles[i];
    }
  }
  AddExtras(m, ctx, &j);
  if (detailed) AddDetailed(records, &j);
  return j;
}

namespace {

constexpr const char* kCsvColumns[] = {"label",
                                       "sweep_variable",
                                       "sweep_value",
                                       "request_rate",
                                       "max_concurrency",
                                       "num_prompts",
                                       "completed",
                                       "failed",
                                       "duration",
                                       "request_throughput",
                                       "request_goodput",
                                       "output_throughput",
                                       "total_token_throughput",
                                       "mean_ttft_ms",
                                       "median_ttft_ms",
                                       "p99_ttft_ms",
                                       "mean_tpot_ms",
                                       "median_tpot_ms",
                                       "p99_tpot_ms",
                                       "mean_itl_ms",
                                       "median_itl_ms",
                                       "p99_itl_ms",
                                       "mean_e2el_ms",
                                       "median_e2el_ms",
                                       "p99_e2el_ms",
                                       "seed",
                                       "prompts_shared_across_points"};

std::string CsvCell(const json& v) {
  if (v.is_null()) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return absl::StrFormat("%.6g", v.get<double>());
  return v.dump();
}

}  // namespace

std::string CsvHeader() { return absl::StrJoin(kCsvColumns, ",") + "\n"; }

std::string CsvRow(const json& result) {
  std::vector<std::string> cells;
  for (const char* column : kCsvColumns) {
    cells.push_back(result.contains(column) ? CsvCell(result[column]) : "");
  }
  return absl::StrJoin(cells, ",") + "\n";
}

}  // namespace tandem::loadgen
