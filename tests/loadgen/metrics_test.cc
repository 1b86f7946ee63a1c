#include "loadgen/metrics.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem::loadgen {
namespace {

constexpr int64_t kMs = 1'000'000;

RequestRecord Ok(int64_t scheduled_ms, int64_t released_ms, std::vector<int64_t> chunks_ms,
                 int output_tokens, int prompt_len) {
  RequestRecord r;
  r.success = true;
  r.scheduled_ns = scheduled_ms * kMs;
  r.released_ns = released_ms * kMs;
  r.send_ns = r.released_ns + kMs;
  for (int64_t c : chunks_ms) r.chunk_ns.push_back(c * kMs);
  r.output_tokens = output_tokens;
  r.prompt_len = prompt_len;
  return r;
}

// Four requests whose every metric is computed by hand in the comments.
std::vector<RequestRecord> HandRecords() {
  std::vector<RequestRecord> r;
  r.push_back(Ok(0, 0, {10, 15, 25}, 3, 10));    // ttft 10, e2el 25, tpot 7.5, itl 5 10
  r.push_back(Ok(100, 120, {150, 160}, 2, 20));  // queue 20, ttft 30, e2el 40, tpot 10, itl 10
  RequestRecord failed;
  failed.cause = FailureCause::kHttpStatus;
  failed.error = "HTTP 503";
  r.push_back(failed);
  r.push_back(Ok(1000, 1000, {1005}, 1, 30));  // ttft 5, e2el 5, no tpot, no itl
  return r;
}

TEST(MetricsTest, EveryMetricMatchesHandComputation) {
  Slo slo;
  slo.ttft_ms = 20;
  slo.tpot_ms = 9;
  Metrics m = ComputeMetrics(HandRecords(), 2.0, {50, 99}, slo);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.failed_by_cause["http_status"], 1);
  EXPECT_EQ(m.total_input_tokens, 60);
  EXPECT_EQ(m.total_output_tokens, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 33.0);
  ASSERT_TRUE(m.request_goodput.has_value());
  EXPECT_DOUBLE_EQ(*m.request_goodput, 1.0);  // requests 0 and 3 meet both SLOs

  const Distribution& ttft = m.dists["ttft"];
  EXPECT_DOUBLE_EQ(ttft.mean, 15);
  EXPECT_DOUBLE_EQ(ttft.median, 10);
  EXPECT_NEAR(ttft.std, std::sqrt(350.0 / 3), 1e-9);
  EXPECT_NEAR(ttft.percentiles[1], 29.6, 1e-9);  // sorted 5 10 30: 10 + 0.98 * 20
  EXPECT_DOUBLE_EQ(m.dists["tpot"].mean, 8.75);
  EXPECT_EQ(m.dists["tpot"].count, 2u);
  EXPECT_NEAR(m.dists["itl"].mean, 25.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(m.dists["e2el"].mean, 70.0 / 3);
  EXPECT_NEAR(m.dists["client_queue_time"].mean, 20.0 / 3, 1e-9);
  EXPECT_NEAR(m.dists["e2el_including_client_queue"].mean, 90.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 5);  // 5 chunks in second 0, 1 in second 1
  EXPECT_DOUBLE_EQ(m.max_concurrent_requests, 2);
  EXPECT_DOUBLE_EQ(m.send_lag.mean, 0.75);  // 1 ms for the three sent OK, 0 for the failed one
  EXPECT_EQ(m.phase_requests, 0);
}

TEST(MetricsTest, GoodputWithoutSlosIsAbsentAndEmptyRunsAreZero) {
  Metrics m = ComputeMetrics({}, 0.0, {99}, Slo());
  EXPECT_FALSE(m.request_goodput.has_value());
  EXPECT_EQ(m.dists["ttft"].mean, 0);
  EXPECT_EQ(m.dists["ttft"].percentiles.size(), 1u);
}

TEST(MetricsTest, ServerPhasesAndRemainder) {
  std::vector<RequestRecord> r = {Ok(0, 0, {40, 50}, 2, 5)};
  ServerTiming t;
  t.queue_ms = 5;
  t.prefill_ms = 20;
  t.kv_transfer_ms = 4;
  r[0].server_timing = t;  // first_decode not reported: counts as 0
  Metrics m = ComputeMetrics(r, 1.0, {99}, Slo());
  ASSERT_EQ(m.phase_requests, 1);
  EXPECT_DOUBLE_EQ(m.phases["prefill"].mean, 20);
  EXPECT_DOUBLE_EQ(m.phases["first_decode"].mean, 0);
  EXPECT_DOUBLE_EQ(m.phases["other"].mean, 11);  // 40 - (5 + 20 + 4)
}

TEST(MetricsTest, ParseGoodputAcceptsVllmSyntaxAndRejectsGarbage) {
  auto slo = ParseGoodput({"ttft:200", "tpot:50", "e2el:5000.5"});
  ASSERT_TRUE(slo.ok());
  EXPECT_EQ(*slo->ttft_ms, 200);
  EXPECT_EQ(*slo->e2el_ms, 5000.5);
  EXPECT_FALSE(ParseGoodput({"ttft=200"}).ok());
  EXPECT_FALSE(ParseGoodput({"latency:3"}).ok());
  EXPECT_FALSE(ParseGoodput({"tpot:-1"}).ok());
}

}  // namespace
}  // namespace tandem::loadgen
