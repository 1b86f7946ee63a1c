#include "loadgen/driver.h"

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "loadgen/arrivals.h"
#include "loadgen/benchmark_runner.h"
#include "loadgen/dataset.h"
#include "loadgen/html_report.h"
#include "loadgen/http_target.h"
#include "loadgen/metrics.h"
#include "loadgen/result_io.h"
#include "loadgen/sweep.h"
#include "loadgen/sweep_prompts.h"
#include "loadgen/tokenizer_prompt_source.h"

namespace tandem::loadgen {

using nlohmann::json;

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-loadgen: %s\n", status.ToString().c_str());
  return 1;
}

absl::StatusOr<HttpTargetOptions> MakeTargetOptions(const Config& c) {
  HttpTargetOptions t;
  t.base_url =
      c.base_url.empty() ? absl::StrCat("http://", c.host, ":", c.port.value_or(8000)) : c.base_url;
  t.chat = c.backend == "openai-chat";
  t.endpoint = !c.endpoint.empty() ? c.endpoint
               : t.chat            ? "/v1/chat/completions"
                                   : "/v1/completions";
  t.model = c.model;
  t.ignore_eos = c.ignore_eos.value_or(c.dataset_name != "sharegpt");
  t.temperature = c.temperature;
  t.extra_body = c.extra_body;
  if (!t.extra_body.empty() && !json::parse(t.extra_body, nullptr, false).is_object()) {
    return absl::InvalidArgumentError("--extra-body must be a JSON object");
  }
  for (const std::string& h : c.headers) {
    size_t eq = h.find('=');
    if (eq == std::string::npos) return absl::InvalidArgumentError("--header expects KEY=VALUE");
    t.headers.push_back(absl::StrCat(h.substr(0, eq), ": ", h.substr(eq + 1)));
  }
  if (const char* key = std::getenv("OPENAI_API_KEY")) t.api_key = key;
  t.request_timeout_s = c.request_timeout_s;
  return t;
}

GrpcTargetOptions MakeGrpcOptions(const Config& c, const HttpTargetOptions& http) {
  GrpcTargetOptions g;
  std::string address =
      c.base_url.empty() ? absl::StrCat(c.host, ":", c.port.value_or(8001)) : c.base_url;
  for (const char* scheme : {"grpc://", "http://"}) {
    if (address.rfind(scheme, 0) == 0) address = address.substr(std::string(scheme).size());
  }
  while (!address.empty() && address.back() == '/') address.pop_back();
  g.address = address;
  g.model = c.model;
  g.chat = false;
  g.ignore_eos = http.ignore_eos;
  g.temperature = c.temperature;
  g.api_key = http.api_key;
  g.request_timeout_s = c.request_timeout_s;
  return g;
}

// --model, else the first served model (GET /v1/models or ListModels).
absl::StatusOr<std::string> ResolveModel(const SweepPlan& plan) {
  if (!plan.config.model.empty()) return plan.config.model;
  return plan.grpc ? FetchFirstGrpcModelId(plan.grpc_target.address)
                   : FetchFirstModelId(plan.target.base_url);
}

int Compare(const Config& c) {
  std::vector<ReportSeries> series;
  for (const std::string& path : c.compare) {
    auto s = LoadSeries(path);
    if (!s.ok()) return Fail(s.status());
    series.push_back(std::move(*s));
  }
  std::string path = c.report.empty()
                         ? (std::filesystem::path(c.result_dir) / "compare-report.html").string()
                         : c.report;
  absl::Status written = WriteTextFile(path, RenderHtmlReport(series, "tandem-loadgen comparison"));
  if (!written.ok()) return Fail(written);
  std::printf("Report: %s\n", path.c_str());
  return 0;
}

}  // namespace

int RunLoadgen(const Config& c) {
  if (!c.compare.empty()) return Compare(c);
  SweepPlan plan;
  plan.config = c;
  auto target_options = MakeTargetOptions(c);
  if (!target_options.ok()) return Fail(target_options.status());
  plan.target = *target_options;
  plan.grpc = c.backend == "tandem-grpc";
  plan.grpc_target = MakeGrpcOptions(c, plan.target);
  auto slo = ParseGoodput(c.goodput);
  if (!slo.ok()) return Fail(slo.status());
  plan.slo = *slo;
  absl::Status s = ParsePercentileMetrics(c.percentile_metrics, &plan.percentile_metrics);
  if (s.ok()) s = ParseMetricPercentiles(c.metric_percentiles, &plan.percentiles);
  if (s.ok()) s = ParseSweep(c.sweep, &plan.sweep_variable, &plan.sweep_values);
  if (s.ok()) s = ParseSweepPromptMode(c.sweep_prompts).status();
  if (!s.ok()) return Fail(s);
  auto model = ResolveModel(plan);
  if (!model.ok()) return Fail(model.status());
  plan.model = plan.target.model = plan.grpc_target.model = *model;
  std::unique_ptr<PromptSource> source = MakeWordPromptSource();
  if (!c.tokenizer.empty()) {
    auto tokenizer_source = MakeTokenizerPromptSource(c.tokenizer);
    if (!tokenizer_source.ok()) return Fail(tokenizer_source.status());
    source = std::move(*tokenizer_source);
  }
  const int points = plan.sweep_values.empty() ? 1 : static_cast<int>(plan.sweep_values.size());
  auto prompts = SweepPrompts::Create(c, points, std::move(source));
  if (!prompts.ok()) return Fail(prompts.status());
  plan.prompts = std::move(*prompts);
  return RunSweep(plan);
}

}  // namespace tandem::loadgen
