#include "loadgen/result_io.h"

#include <cstdio>
#include <limits>

#include "gtest/gtest.h"
#include "loadgen/html_report.h"
#include "loadgen/sweep.h"

namespace tandem::loadgen {
namespace {

constexpr int64_t kMs = 1'000'000;

std::vector<RequestRecord> Records() {
  RequestRecord r;
  r.success = true;
  r.chunk_ns = {20 * kMs, 30 * kMs, 50 * kMs};
  r.output_tokens = 3;
  r.prompt_len = 8;
  RequestRecord failed;
  failed.cause = FailureCause::kTimeout;
  failed.error = "request timed out";
  return {r, failed};
}

std::string Printed(const Metrics& m, const RunContext& ctx) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  PrintResultBlock(m, ctx, f);
  std::fclose(f);
  std::string out(buf, len);
  free(buf);
  return out;
}

TEST(ResultIoTest, PrintedBlockHasVllmLinesAndFormat) {
  Slo slo;
  slo.ttft_ms = 100;
  Metrics m = ComputeMetrics(Records(), 2.0, {50, 99.9}, slo);
  RunContext ctx;
  ctx.request_rate = 4;
  ctx.max_concurrency = 8;
  ctx.percentile_metrics = {"ttft", "e2el"};
  std::string out = Printed(m, ctx);
  EXPECT_NE(out.find("============ Serving Benchmark Result ============\n"), std::string::npos);
  EXPECT_NE(out.find("Successful requests:                     1         \n"), std::string::npos);
  EXPECT_NE(out.find("Maximum request concurrency:             8"), std::string::npos);
  EXPECT_NE(out.find("Request rate configured (RPS):           4.00"), std::string::npos);
  EXPECT_NE(out.find("Request goodput (req/s):                 0.50"), std::string::npos);
  EXPECT_NE(out.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(out.find("Mean TTFT (ms):                          20.00"), std::string::npos);
  EXPECT_NE(out.find("P99.9 E2EL (ms):                         50.00"), std::string::npos);
  EXPECT_EQ(out.find("TPOT"), std::string::npos);  // not selected
  EXPECT_NE(out.find("timeout:                                 1"), std::string::npos);
  ctx.request_rate = std::numeric_limits<double>::infinity();
  EXPECT_EQ(Printed(m, ctx).find("Request rate configured"), std::string::npos);
}

TEST(ResultIoTest, JsonHasVllmKeysAndExtras) {
  Metrics m = ComputeMetrics(Records(), 2.0, {50, 99.9}, Slo());
  RunContext ctx;
  ctx.model_id = "org/model";
  ctx.request_rate = std::numeric_limits<double>::infinity();
  ctx.metadata["layout"] = "1p1d";
  ctx.percentile_metrics = {"ttft", "itl"};
  nlohmann::json j = ResultJson(m, ctx, Records(), /*detailed=*/true);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_TRUE(j["max_concurrency"].is_null());
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["layout"], "1p1d");
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 20.0);
  EXPECT_NEAR(j["p99.9_itl_ms"].get<double>(), 19.99, 1e-9);  // itls 10, 20: 10 + 0.999 * 10
  EXPECT_TRUE(j.contains("std_itl_ms"));
  EXPECT_FALSE(j.contains("mean_tpot_ms"));
  EXPECT_EQ(j["failed_by_cause"]["timeout"], 1);
  EXPECT_EQ(j["cdf_ms"]["ttft"].size(), 101u);
  ASSERT_EQ(j["ttfts"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["ttfts"][0].get<double>(), 0.02);  // seconds, as vLLM
  EXPECT_EQ(j["errors"][1], "request timed out");
  EXPECT_FALSE(ResultJson(m, ctx, Records(), false).contains("ttfts"));
  std::string csv = CsvHeader() + CsvRow(j);
  EXPECT_NE(csv.find("label,sweep_variable"), std::string::npos);
  EXPECT_NE(csv.find("\nopenai,,,inf,,0,1,1,2,"), std::string::npos) << csv;
  EXPECT_EQ(DefaultResultFilename(ctx, "20250101-000000"),
            "openai-infqps-model-20250101-000000.json");
  ctx.request_rate = 2.5;
  ctx.max_concurrency = 4;
  ctx.label = "mine";
  EXPECT_EQ(DefaultResultFilename(ctx, "T"), "mine-2.5qps-concurrency4-model-T.json");
}

TEST(ResultIoTest, FlagListsAreValidated) {
  std::vector<std::string> metrics;
  std::vector<double> percentiles;
  EXPECT_TRUE(ParsePercentileMetrics("ttft,e2el,client_queue_time", &metrics).ok());
  EXPECT_EQ(metrics.size(), 3u);
  EXPECT_FALSE(ParsePercentileMetrics("ttft,latency", &metrics).ok());
  EXPECT_TRUE(ParseMetricPercentiles("25,50,99.9", &percentiles).ok());
  EXPECT_EQ(percentiles, (std::vector<double>{25, 50, 99.9}));
  EXPECT_FALSE(ParseMetricPercentiles("101", &percentiles).ok());
  EXPECT_EQ(PercentileWord(99), "99");
  EXPECT_EQ(PercentileWord(99.9), "99.9");
  std::string variable;
  std::vector<double> values;
  EXPECT_TRUE(ParseSweep("rate=1,2.5,4", &variable, &values).ok());
  EXPECT_EQ(variable, "rate");
  EXPECT_EQ(values, (std::vector<double>{1, 2.5, 4}));
  EXPECT_FALSE(ParseSweep("qps=1", &variable, &values).ok());
  EXPECT_FALSE(ParseSweep("concurrency=0", &variable, &values).ok());
}

TEST(ResultIoTest, HtmlReportIsSelfContainedAndComparesSeries) {
  Slo slo;
  slo.ttft_ms = 100;
  RunContext ctx;
  std::vector<ReportSeries> series(2);
  for (int s = 0; s < 2; ++s) {
    series[s].label = s == 0 ? "layout <A>" : "layout B";
    for (double rate : {1.0, 2.0}) {
      ctx.request_rate = rate;
      ctx.sweep_variable = "rate";
      ctx.sweep_value = rate;
      series[s].points.push_back(
          ResultJson(ComputeMetrics(Records(), 2.0, {99}, slo), ctx, Records(), false));
    }
  }
  std::string html = RenderHtmlReport(series, "cmp");
  size_t svgs = 0;
  for (size_t pos = html.find("<svg"); pos != std::string::npos; pos = html.find("<svg", pos + 1)) {
    ++svgs;
  }
  EXPECT_EQ(svgs, 8u);  // 4 latency, throughput, 2 CDFs, phases
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://", html.find("<body")), html.find("http://www.w3.org"));
  EXPECT_NE(html.find("layout &lt;A&gt; @ 2 req/s"), std::string::npos);
  EXPECT_NE(html.find("layout B p99"), std::string::npos);
  EXPECT_EQ(html.find("layout <A>"), std::string::npos);
}

}  // namespace
}  // namespace tandem::loadgen
