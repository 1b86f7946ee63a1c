// End-to-end exactness: the real HttpTarget and BenchmarkRunner against the in-process
// FakeServer, whose per-token delays are scripted. Every expected value below is computed by
// hand from the script (see fake_server.h for the timing contract).
//
// Tolerance: a measured time may exceed the scripted one by the time the kernel takes to wake
// the server's timer thread and then the loadgen's thread and move bytes over loopback. That is
// well under 1 ms on an idle machine, but these tests share 2 cores with parallel compiles and
// other tests, where a runnable thread can wait a full scheduler slice or two; kSlackMs covers
// that. Latencies can never be *shorter* than scripted (timers never fire early and the server's
// clock starts after the client sent), so lower bounds are exact; an ITL (a difference of two
// late events) is bounded on both sides.
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "loadgen/benchmark_runner.h"
#include "loadgen/fake_server.h"
#include "loadgen/http_target.h"
#include "loadgen/metrics.h"

namespace tandem::loadgen {
namespace {

constexpr double kSlackMs = 15.0;

struct Harness {
  explicit Harness(FakeServerOptions server_options) : server(std::move(server_options)) {}

  RunResult Run(const std::vector<RequestSpec>& specs, const std::vector<double>& arrivals,
                RunOptions run_options = {}, HttpTargetOptions target_options = {}) {
    auto port = server.Start();
    EXPECT_TRUE(port.ok()) << port.status();
    target_options.base_url = "http://127.0.0.1:" + std::to_string(*port);
    auto target = HttpTarget::Create(io, &clock, target_options);
    EXPECT_TRUE(target.ok()) << target.status();
    BenchmarkRunner local_runner(io, &clock, target->get());
    runner = &local_runner;
    RunResult result = local_runner.Run(specs, arrivals, run_options);
    runner = nullptr;
    server.Stop();
    return result;
  }

  boost::asio::io_context io;
  BenchClock clock;
  FakeServer server;
  std::atomic<BenchmarkRunner*> runner{nullptr};  // set while Run() runs
};

std::vector<RequestSpec> Specs(int n, int output_len) {
  std::vector<RequestSpec> specs(n);
  for (int i = 0; i < n; ++i) {
    specs[i].prompt = "case-" + std::to_string(i) + " one two three";
    specs[i].prompt_len = 4;
    specs[i].output_len = output_len;
  }
  return specs;
}

std::vector<double> Every(int n, double gap_s) {
  std::vector<double> t(n);
  for (int i = 0; i < n; ++i) t[i] = i * gap_s;
  return t;
}

double Ms(int64_t ns) { return ns / 1e6; }

// Checks a measured latency against its scripted value: never early, at most kSlackMs late.
#define EXPECT_LATE_BY_AT_MOST_SLACK(measured, scripted) \
  do {                                                   \
    EXPECT_GE((measured), (scripted)-0.01);              \
    EXPECT_LE((measured), (scripted) + kSlackMs);        \
  } while (0)

TEST(ExactnessTest, ScriptedDelaysAreReportedExactly) {
  FakeServerOptions options;
  options.script = [](const FakeRequest&) {
    FakeResponse r;
    r.ttft_ms = 30;
    r.itl_ms = {10, 20};  // gaps 10, 20, 20, 20
    return r;
  };
  Harness h(options);
  RunResult result = h.Run(Specs(8, 5), Every(8, 0.025));
  ASSERT_EQ(result.records.size(), 8u);
  const double kGaps[] = {10, 20, 20, 20};
  for (const RequestRecord& r : result.records) {
    ASSERT_TRUE(r.success) << r.error;
    ASSERT_EQ(r.chunk_ns.size(), 5u);
    EXPECT_EQ(r.output_tokens, 5);
    EXPECT_EQ(r.prompt_len, 4);  // from usage: the fake server counts words
    EXPECT_LATE_BY_AT_MOST_SLACK(r.TtftMs(), 30.0);
    EXPECT_LATE_BY_AT_MOST_SLACK(r.E2elMs(), 100.0);
    for (int k = 1; k < 5; ++k) {
      EXPECT_NEAR(Ms(r.chunk_ns[k] - r.chunk_ns[k - 1]), kGaps[k - 1], kSlackMs);
    }
  }
  Metrics m = ComputeMetrics(result.records, result.duration_s, {50, 99}, Slo());
  EXPECT_EQ(m.completed, 8);
  EXPECT_LATE_BY_AT_MOST_SLACK(m.dists["ttft"].mean, 30.0);
  EXPECT_LATE_BY_AT_MOST_SLACK(m.dists["e2el"].median, 100.0);
  EXPECT_NEAR(m.dists["tpot"].mean, 17.5, kSlackMs / 4);  // (100 - 30) / (5 - 1)
  EXPECT_NEAR(m.dists["itl"].mean, 17.5, kSlackMs / 4);
  EXPECT_EQ(m.dists["itl"].count, 32u);
  EXPECT_EQ(m.total_output_tokens, 40);
  // The last request is due at 175 ms and takes 100 ms.
  EXPECT_LATE_BY_AT_MOST_SLACK(result.duration_s * 1e3, 275.0);
}

TEST(ExactnessTest, OverloadGrowsLatencyButNeverSlowsArrivals) {
  // One slot; each request holds it 20 + 4 * 5 = 40 ms; arrivals every 20 ms. Request i starts
  // at 40 i, so TTFT_i = 40 i + 20 - 20 i = 20 i + 20 and E2EL_i = 20 i + 40.
  FakeServerOptions options;
  options.slots = 1;
  options.script = [](const FakeRequest&) {
    FakeResponse r;
    r.ttft_ms = 20;
    r.itl_ms = {5};
    return r;
  };
  Harness h(options);
  RunResult result = h.Run(Specs(8, 5), Every(8, 0.020));
  ASSERT_EQ(result.records.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const RequestRecord& r = result.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_LATE_BY_AT_MOST_SLACK(r.TtftMs(), 20.0 * i + 20);
    EXPECT_LATE_BY_AT_MOST_SLACK(r.E2elMs(), 20.0 * i + 40);
    // Arrivals keep their schedule: sent when due, not when the server caught up.
    EXPECT_EQ(r.released_ns, r.scheduled_ns);
    EXPECT_NEAR(Ms(r.scheduled_ns), 20.0 * i, 1e-6);
    EXPECT_LE(Ms(r.send_ns - r.scheduled_ns), kSlackMs);
  }
  Metrics m = ComputeMetrics(result.records, result.duration_s, {99}, Slo());
  EXPECT_LATE_BY_AT_MOST_SLACK(m.dists["ttft"].mean, 90.0);  // mean of 20 i + 20, i < 8
  EXPECT_LATE_BY_AT_MOST_SLACK(result.duration_s * 1e3, 320.0);
}

TEST(ExactnessTest, ClosedLoopConcurrencyCapQueuesOnTheClient) {
  // Cap 2, everything due at t = 0, each request takes 10 + 2 * 10 = 30 ms: requests 2k and
  // 2k+1 are released at 30 k ms (client queue 30 k), and their own latencies stay 10 / 30 ms.
  FakeServerOptions options;
  options.script = [](const FakeRequest&) {
    FakeResponse r;
    r.ttft_ms = 10;
    r.itl_ms = {10};
    return r;
  };
  Harness h(options);
  RunOptions run;
  run.max_concurrency = 2;
  RunResult result = h.Run(Specs(6, 3), std::vector<double>(6, 0.0), run);
  ASSERT_EQ(result.records.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    const RequestRecord& r = result.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_LATE_BY_AT_MOST_SLACK(r.ClientQueueMs(), 30.0 * (i / 2));
    EXPECT_LATE_BY_AT_MOST_SLACK(r.TtftMs(), 10.0);
    EXPECT_LATE_BY_AT_MOST_SLACK(r.E2elMs(), 30.0);
  }
}

TEST(ExactnessTest, FailuresAreCountedByCauseAndExcludedFromLatencies) {
  FakeServerOptions options;
  options.script = [](const FakeRequest& req) {
    FakeResponse r;
    r.ttft_ms = 5;
    if (req.prompt.rfind("case-0", 0) == 0) r.http_status = 503;
    if (req.prompt.rfind("case-1", 0) == 0) r.error_after_tokens = 2;
    if (req.prompt.rfind("case-2", 0) == 0) r.drop_after_tokens = 1;
    if (req.prompt.rfind("case-3", 0) == 0) r.num_tokens = 0;
    return r;
  };
  Harness h(options);
  RunResult result = h.Run(Specs(5, 4), Every(5, 0.005));
  Metrics m = ComputeMetrics(result.records, result.duration_s, {99}, Slo());
  EXPECT_EQ(m.completed, 1);
  EXPECT_EQ(m.failed, 4);
  EXPECT_EQ(m.failed_by_cause["http_status"], 1);
  EXPECT_EQ(m.failed_by_cause["stream_error"], 1);
  EXPECT_EQ(m.failed_by_cause["transport"], 1);
  EXPECT_EQ(m.failed_by_cause["no_token"], 1);
  EXPECT_EQ(m.dists["ttft"].count, 1u);
  EXPECT_EQ(m.total_output_tokens, 4);
  EXPECT_NE(result.records[0].error.find("503"), std::string::npos) << result.records[0].error;
  EXPECT_NE(result.records[1].error.find("scripted failure"), std::string::npos);
}

TEST(ExactnessTest, ChatChunksOfSeveralTokensUseUsageForTpotAndReportServerPhases) {
  FakeServerOptions options;
  options.script = [](const FakeRequest&) {
    FakeResponse r;
    r.ttft_ms = 20;
    r.itl_ms = {5};
    r.tokens_per_chunk = 2;  // 6 tokens in 3 chunks: tokens 0-1 at 25, 2-3 at 35, 4-5 at 45 ms
    ServerTiming t;
    t.queue_ms = 2;
    t.prefill_ms = 12;
    t.kv_transfer_ms = 3;
    t.first_decode_ms = 1;
    r.server_timing = t;
    return r;
  };
  Harness h(options);
  HttpTargetOptions target;
  target.chat = true;
  target.endpoint = "/v1/chat/completions";
  target.keep_text = true;
  RunResult result = h.Run(Specs(3, 6), Every(3, 0.01), {}, target);
  for (const RequestRecord& r : result.records) {
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.chunk_ns.size(), 3u);
    EXPECT_EQ(r.output_tokens, 6);
    EXPECT_EQ(r.generated_text, " w0 w1 w2 w3 w4 w5");
    EXPECT_LATE_BY_AT_MOST_SLACK(r.TtftMs(), 25.0);
    EXPECT_LATE_BY_AT_MOST_SLACK(r.E2elMs(), 45.0);
  }
  Metrics m = ComputeMetrics(result.records, result.duration_s, {99}, Slo());
  EXPECT_NEAR(m.dists["tpot"].mean, 4.0, kSlackMs / 5);  // (45 - 25) / (6 - 1)
  EXPECT_NEAR(m.dists["itl"].mean, 10.0, kSlackMs / 2);
  ASSERT_EQ(m.phase_requests, 3);
  EXPECT_DOUBLE_EQ(m.phases["prefill"].mean, 12);
  EXPECT_LATE_BY_AT_MOST_SLACK(m.phases["other"].mean, 25.0 - 18);
}

TEST(ExactnessTest, StopKeepsWhatWasMeasuredAndCancelsTheRest) {
  FakeServerOptions options;
  options.script = [](const FakeRequest& req) {
    FakeResponse r;
    r.ttft_ms = req.prompt.rfind("case-0", 0) == 0 ? 1 : 5000;  // only request 0 finishes
    return r;
  };
  Harness h(options);
  // The harness publishes its runner once the fake server and the target are up, which on a
  // loaded machine can take longer than 300 ms (then no stop came and the run took 5 s): wait
  // for it, then stop ~300 ms into the run.
  std::thread stopper([&h] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    BenchmarkRunner* runner = h.runner.load();
    while (runner == nullptr && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      runner = h.runner.load();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (runner != nullptr) runner->Stop();
  });
  auto t0 = std::chrono::steady_clock::now();
  // 10 requests every 100 ms: 0..2 are sent before the stop at ~300 ms, the rest never.
  RunResult result = h.Run(Specs(10, 2), Every(10, 0.1));
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_TRUE(result.interrupted);
  EXPECT_GE(result.not_sent, 6);
  Metrics m = ComputeMetrics(result.records, result.duration_s, {99}, Slo());
  EXPECT_EQ(m.completed, 1);
  EXPECT_EQ(m.failed_by_cause["cancelled"], m.failed);
  EXPECT_GE(m.failed, 2);
}

}  // namespace
}  // namespace tandem::loadgen
