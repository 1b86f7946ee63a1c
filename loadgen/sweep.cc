#include "loadgen/sweep.h"

#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cmath>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "loadgen/arrivals.h"
#include "loadgen/benchmark_runner.h"
#include "loadgen/html_report.h"
#include "loadgen/result_io.h"

namespace tandem::loadgen {

using nlohmann::json;

absl::Status ParseSweep(const std::string& text, std::string* variable,
                        std::vector<double>* values) {
  variable->clear();
  values->clear();
  if (text.empty()) return absl::OkStatus();
  size_t eq = text.find('=');
  std::string name = text.substr(0, eq);
  if (eq == std::string::npos || (name != "rate" && name != "concurrency")) {
    return absl::InvalidArgumentError("--sweep expects rate=V1,V2,... or concurrency=V1,V2,...");
  }
  for (absl::string_view part : absl::StrSplit(text.substr(eq + 1), ',', absl::SkipWhitespace())) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sweep: bad value '", std::string(part), "'"));
    }
    values->push_back(v);
  }
  if (values->empty()) return absl::InvalidArgumentError("--sweep: no values");
  *variable = name;
  return absl::OkStatus();
}

namespace {

struct PointOutcome {
  json result;
  bool interrupted = false;
  bool ok = false;
};

// Arrivals are drawn with the point's seed, so a seed-drawn point is exactly a plain run with
// --seed <its seed> (sweep_prompts.h).
absl::StatusOr<std::vector<double>> Arrivals(const SweepPlan& plan, const PointPrompts& point,
                                             double rate) {
  const std::vector<RequestSpec>& specs = point.specs;
  bool trace = !specs.empty() && specs.front().has_arrival;
  if (!trace) {
    return GammaArrivals(static_cast<int>(specs.size()), rate, plan.config.burstiness, point.seed);
  }
  std::vector<double> t;
  for (const RequestSpec& s : specs) t.push_back(s.arrival_s);
  return t;
}

RunContext MakeContext(const SweepPlan& plan, const PointPrompts& point, double rate,
                       int concurrency) {
  const Config& c = plan.config;
  RunContext ctx;
  ctx.backend = c.backend;
  ctx.label = c.label;
  ctx.model_id = plan.model;
  ctx.tokenizer_id = c.tokenizer.empty() ? plan.model : c.tokenizer;
  ctx.dataset_name = c.dataset_name;
  ctx.num_prompts = static_cast<int>(point.specs.size());
  ctx.seed = point.seed;
  ctx.request_rate = rate;
  ctx.burstiness = c.burstiness;
  ctx.max_concurrency = concurrency;
  for (const std::string& kv : c.metadata) {
    size_t eq = kv.find('=');
    ctx.metadata[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
  }
  ctx.percentile_metrics = plan.percentile_metrics;
  return ctx;
}

absl::StatusOr<std::unique_ptr<Target>> MakeTarget(const SweepPlan& plan,
                                                   boost::asio::io_context& io,
                                                   const BenchClock* clock) {
  if (plan.grpc) {
    GrpcTargetOptions options = plan.grpc_target;
    options.keep_text = plan.config.save_detailed;
    auto target = GrpcTarget::Create(io, clock, options);
    if (!target.ok()) return target.status();
    return std::unique_ptr<Target>(std::move(*target));
  }
  HttpTargetOptions options = plan.target;
  options.keep_text = plan.config.save_detailed;
  auto target = HttpTarget::Create(io, clock, options);
  if (!target.ok()) return target.status();
  return std::unique_ptr<Target>(std::move(*target));
}

PointOutcome RunPoint(const SweepPlan& plan, const PointPrompts& point, double rate,
                      int concurrency, RunContext* ctx) {
  PointOutcome out;
  *ctx = MakeContext(plan, point, rate, concurrency);
  auto arrivals = Arrivals(plan, point, rate);
  if (!arrivals.ok()) {
    std::fprintf(stderr, "tandem-loadgen: %s\n", arrivals.status().ToString().c_str());
    return out;
  }
  boost::asio::io_context io;
  BenchClock clock;
  auto target = MakeTarget(plan, io, &clock);
  if (!target.ok()) {
    std::fprintf(stderr, "tandem-loadgen: %s\n", target.status().ToString().c_str());
    return out;
  }
  BenchmarkRunner runner(io, &clock, target->get());
  RunOptions run;
  run.max_concurrency = concurrency;
  run.progress = plan.config.progress.value_or(isatty(STDERR_FILENO) != 0);
  run.handle_sigint = true;
  RunResult result = runner.Run(point.specs, *arrivals, run);
  Metrics m = ComputeMetrics(result.records, result.duration_s, plan.percentiles, plan.slo);
  ctx->interrupted = result.interrupted;
  ctx->not_sent = result.not_sent;
  PrintResultBlock(m, *ctx, stdout);
  if (m.completed == 0 && m.failed > 0) {
    std::printf("WARNING: all requests failed; this is likely due to a misconfiguration.\n");
  }
  std::fflush(stdout);
  out.result = ResultJson(m, *ctx, result.records, plan.config.save_detailed);
  out.interrupted = result.interrupted;
  out.ok = true;
  return out;
}

void Save(const std::string& path, const std::string& text) {
  absl::Status s = WriteTextFile(path, text);
  if (s.ok()) {
    std::printf("Saved %s\n", path.c_str());
  } else {
    std::fprintf(stderr, "tandem-loadgen: %s\n", s.ToString().c_str());
  }
}

// Writes one point's JSON and CSV: vLLM's name for a single --save-result run, or
// {stem}-{variable}{value} for sweep points; a single run without --save-result writes nothing.
void SavePoint(const SweepPlan& plan, const RunContext& ctx, const std::filesystem::path& dir,
               const std::string& stem, const std::string& timestamp, double value,
               const json& result) {
  const Config& c = plan.config;
  std::string name;
  if (!plan.sweep_variable.empty()) {
    name = absl::StrFormat("%s-%s%g.json", stem, plan.sweep_variable, value);
  } else if (c.save_result) {
    name = c.result_filename.empty() ? DefaultResultFilename(ctx, timestamp) : c.result_filename;
  } else {
    return;
  }
  Save((dir / name).string(), result.dump(2));
  Save((dir / std::filesystem::path(name).replace_extension(".csv")).string(),
       CsvHeader() + CsvRow(result));
}

}  // namespace

int RunSweep(const SweepPlan& plan) {
  const Config& c = plan.config;
  std::filesystem::path dir(c.result_dir);
  std::error_code ignored;
  if (c.save_result || !plan.sweep_variable.empty() || !c.report.empty()) {
    std::filesystem::create_directories(dir, ignored);
  }
  std::vector<double> values = plan.sweep_values;
  if (values.empty()) values.push_back(0);  // one point with the configured load
  if (plan.prompts == nullptr || plan.prompts->num_points() != static_cast<int>(values.size())) {
    std::fprintf(stderr, "tandem-loadgen: the sweep's prompts do not match its %zu points\n",
                 values.size());
    return 1;
  }
  const bool shared = plan.prompts->shared();
  if (shared)
    std::fprintf(stderr, "tandem-loadgen: warning: %s\n", plan.prompts->warning().c_str());
  std::string timestamp = NowTimestamp();
  std::string stem = std::filesystem::path(c.result_filename).stem().string();
  if (stem.empty()) {
    std::string model = plan.model.substr(plan.model.rfind('/') + 1);
    stem = absl::StrCat(c.label.empty() ? c.backend : c.label, "-", model, "-", timestamp);
  }
  ReportSeries series;
  series.label = c.label.empty() ? c.backend : c.label;
  std::string csv = CsvHeader();
  bool interrupted = false;
  for (size_t i = 0; i < values.size(); ++i) {
    const double value = values[i];
    double rate = plan.sweep_variable == "rate" ? value : c.request_rate;
    int conc = plan.sweep_variable == "concurrency" ? static_cast<int>(value) : c.max_concurrency;
    auto prompts = plan.prompts->Point(static_cast<int>(i));
    if (!prompts.ok()) {
      std::fprintf(stderr, "tandem-loadgen: %s\n", prompts.status().ToString().c_str());
      return 1;
    }
    if (!plan.sweep_variable.empty()) {
      std::printf("\n--- sweep point %s=%g (seed %llu%s) ---\n", plan.sweep_variable.c_str(), value,
                  static_cast<unsigned long long>(prompts->seed),
                  shared && i > 0 ? ", the first point's prompts" : "");
    }
    RunContext ctx;
    PointOutcome point = RunPoint(plan, *prompts, rate, conc, &ctx);
    if (!point.ok) return 1;
    if (!plan.sweep_variable.empty()) {
      point.result["sweep_variable"] = plan.sweep_variable;
      point.result["sweep_value"] = value;
      point.result["sweep_point"] = i;
      point.result["prompts_shared_across_points"] = shared;
    }
    csv += CsvRow(point.result);
    SavePoint(plan, ctx, dir, stem, timestamp, value, point.result);
    if (point.result.contains("itls")) point.result.erase("itls");
    series.points.push_back(std::move(point.result));
    if (point.interrupted) {
      interrupted = true;
      break;
    }
  }
  if (!plan.sweep_variable.empty()) {
    json sweep = {{"tandem_sweep", 1},
                  {"label", series.label},
                  {"sweep_variable", plan.sweep_variable},
                  {"sweep_prompts", c.sweep_prompts},
                  {"prompts_shared_across_points", shared},
                  {"points", series.points}};
    Save((dir / (stem + "-sweep.json")).string(), sweep.dump(2));
    Save((dir / (stem + "-sweep.csv")).string(), csv);
  }
  if (!plan.sweep_variable.empty() || !c.report.empty()) {
    std::string path = c.report.empty() ? (dir / (stem + "-report.html")).string() : c.report;
    Save(path, RenderHtmlReport({series}, absl::StrCat("tandem-loadgen: ", series.label)));
  }
  return interrupted ? 130 : 0;
}

}  // namespace tandem::loadgen
