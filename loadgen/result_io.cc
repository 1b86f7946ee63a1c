#include "loadgen/result_io.h"

#include <cmath>
#include <ctime>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tandem::loadgen {

using nlohmann::json;

namespace {

struct MetricInfo {
  const char* key;
  const char* short_name;
  const char* header;
};
constexpr MetricInfo kMetricInfo[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
    {"client_queue_time", "Client Queue Time", "Client Queue Time"},
    {"e2el_including_client_queue", "E2EL incl. Client Queue",
     "End-to-end Latency incl. Client Queue"},
};

std::string Header(const std::string& title, char fill) {
  int n = 50, len = static_cast<int>(title.size());
  int left = std::max(0, (n - len) / 2), right = std::max(0, n - len - left);
  return std::string(left, fill) + title + std::string(right, fill);
}

void Row(std::FILE* out, const std::string& name, double value) {
  std::fprintf(out, "%-40s %-10.2f\n", name.c_str(), value);
}
void RowInt(std::FILE* out, const std::string& name, int64_t value) {
  std::fprintf(out, "%-40s %-10lld\n", name.c_str(), static_cast<long long>(value));
}

void PrintExtras(const Metrics& m, const RunContext& ctx, std::FILE* out) {
  if (m.failed > 0) {
    std::fprintf(out, "%s\n", Header("Failed Requests by Cause", '-').c_str());
    for (const auto& [cause, count] : m.failed_by_cause) RowInt(out, cause + ":", count);
  }
  if (m.phase_requests > 0) {
    std::fprintf(out, "%s\n", Header("TTFT Phases (server-reported, mean)", '-').c_str());
    RowInt(out, "Requests reporting phases:", m.phase_requests);
    for (const char* phase : kPhaseNames) {
      Row(out, absl::StrCat("Mean ", phase, " (ms):"), m.phases.at(phase).mean);
    }
  }
  std::fprintf(out, "%s\n", Header("Loadgen Health", '-').c_str());
  Row(out, "Mean send lag (ms):", m.send_lag.mean);
  Row(out, "Max send lag (ms):", m.send_lag.cdf.empty() ? 0.0 : m.send_lag.cdf.back());
  if (ctx.interrupted) RowInt(out, "Interrupted; requests never sent:", ctx.not_sent);
}

}  // namespace

absl::Status ParsePercentileMetrics(const std::string& text, std::vector<std::string>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::string name(part);
    bool known = false;
    for (const MetricInfo& info : kMetricInfo) known = known || name == info.key;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--percentile-metrics: unknown metric '", name,
          "' (allowed: ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue)"));
    }
    out->push_back(name);
  }
  return absl::OkStatus();
}

absl::Status ParseMetricPercentiles(const std::string& text, std::vector<double>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    double p = 0;
    if (!absl::SimpleAtod(part, &p) || p < 0 || p > 100) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metric-percentiles: '", std::string(part), "' is not in [0, 100]"));
    }
    out->push_back(p);
  }
  return absl::OkStatus();
}

std::string PercentileWord(double p) {
  if (p == std::floor(p)) return absl::StrCat(static_cast<int>(p));
  return absl::StrFormat("%g", p);
}

void PrintResultBlock(const Metrics& m, const RunContext& ctx, std::FILE* out) {
  std::fprintf(out, "%s\n", Header(" Serving Benchmark Result ", '=').c_str());
  RowInt(out, "Successful requests:", m.completed);
  RowInt(out, "Failed requests:", m.failed);
  if (ctx.max_concurrency > 0) RowInt(out, "Maximum request concurrency:", ctx.max_concurrency);
  if (std::isfinite(ctx.request_rate)) Row(out, "Request rate configured (RPS):", ctx.request_rate);
  Row(out, "Benchmark duration (s):", m.duration_s);
  RowInt(out, "Total input tokens:", m.total_input_tokens);
  RowInt(out, "Total generated tokens:", m.total_output_tokens);
  Row(out, "Request throughput (req/s):", m.request_throughput);
  if (m.request_goodput) Row(out, "Request goodput (req/s):", *m.request_goodput);
  Row(out, "Output token throughput (tok/s):", m.output_throughput);
  Row(out, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  Row(out, "Peak concurrent requests:", m.max_concurrent_requests);
  Row(out, "Total token throughput (tok/s):", m.total_token_throughput);
  for (const MetricInfo& info : kMetricInfo) {
    bool selected = false;
    for (const std::string& s : ctx.percentile_metrics) selected = selected || s == info.key;
    if (!selected) continue;
    const Distribution& d = m.dists.at(info.key);
    std::fprintf(out, "%s\n", Header(info.header, '-').c_str());
    Row(out, absl::StrCat("Mean ", info.short_name, " (ms):"), d.mean);
    Row(out, absl::StrCat("Median ", info.short_name, " (ms):"), d.median);
    for (size_t i = 0; i < m.percentiles.size(); ++i) {
      Row(out, absl::StrCat("P", PercentileWord(m.percentiles[i]), " ", info.short_name, " (ms):"),
          d.percentiles[i]);
    }
  }
  PrintExtras(m, ctx, out);
  std::fprintf(out, "%s\n", std::string(50, '=').c_str());
  for (const std::string& e : m.errors) std::fprintf(out, "Failed request: %s\n", e.c_str());
}

std::string NowTimestamp() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

std::string DefaultResultFilename(const RunContext& ctx, const std::string& timestamp) {
  std::string label = ctx.label.empty() ? ctx.backend : ctx.label;
  std::string rate =
      std::isfinite(ctx.request_rate) ? absl::StrFormat("%g", ctx.request_rate) : "inf";
  std::string model = ctx.model_id.substr(ctx.model_id.rfind('/') + 1);
  if (model.empty()) model = "model";
  std::string concurrency =
      ctx.max_concurrency > 0 ? absl::StrCat("-concurrency", ctx.max_concurrency) : "";
  return absl::StrCat(label, "-", rate, "qps", concurrency, "-", model, "-", timestamp, ".json");
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path));
  return absl::OkStatus();
}

}  // namespace tandem::loadgen
