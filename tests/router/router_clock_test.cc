// The router's time logic end to end on a FakeClock that the fake workers' token delays also
// sleep on: the timings a client and /metrics see are exactly the time the test let pass, the
// admission queue time is exactly the wait for a running slot, the reservation retry budget
// ends exactly when it is spent, and a worker that stops heartbeating is marked down at the
// first expiry check past the limit, not before. Nothing here depends on how fast the machine is.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/base/fake_clock.h"
#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using nlohmann::json;
using ::tandem::testing::FakeClock;
using tandem::v1::WORKER_ROLE_DECODE;
using tandem::v1::WORKER_ROLE_MIXED;
using tandem::v1::WORKER_ROLE_PREFILL;
using ::testing::HasSubstr;

constexpr int kDelayMs = 10;  // each fake worker sleep, on the fake clock
constexpr absl::Duration kDelay = absl::Milliseconds(kDelayMs);

// The value of a sample in a Prometheus text page: "name value" or "name{labels} value" (the
// first one of that name); -1 if absent.
double Sample(const std::string& page, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::ConsumePrefix(&line, name)) continue;
    if (absl::StartsWith(line, "{")) line.remove_prefix(std::min(line.size(), line.find('}') + 1));
    double value = 0;
    if (absl::ConsumePrefix(&line, " ") && absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

// The "timings" object of a stream's usage chunk (the event before [DONE]).
json StreamTimings(const StreamingCall& call) {
  std::vector<std::string> events = call.Events();
  if (events.size() < 2 || events.back() != "[DONE]") return json();
  return json::parse(events[events.size() - 2], nullptr, false)["timings"];
}

class RouterClockTest : public ::testing::Test {
 protected:
  RouterConfig Config() {
    RouterConfig config = TestRouterConfig();
    config.clock = &clock_;
    // No heartbeat expiry while timings are measured (the workers' heartbeats are real time).
    config.heartbeat_interval_ms = 3600 * 1000;
    return config;
  }
  FakeWorkerOptions Worker(const std::string& id, tandem::v1::WorkerRole role) {
    FakeWorkerOptions options = Role(id, role, kDelayMs);
    options.clock = &clock_;
    return options;
  }
  // Waits until some thread (a fake worker's token delay, the router's retry timer) sleeps
  // until exactly Now() + d, then lets d pass.
  void Pass(absl::Duration d) {
    ASSERT_TRUE(clock_.AwaitWaiterUntil(clock_.Now() + d)) << "nothing sleeps for " << d;
    clock_.Advance(d);
  }

  FakeClock clock_;  // first: outlives the router and the workers
};

constexpr char kStream[] =
    R"({"prompt": "x", "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}})";

TEST_F(RouterClockTest, TimingsThroughPrefillAndDecodeAreExactlyTheTimeThatPassed) {
  RouterTestEnv env(Config());
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorkerOptions prefill = Worker("prefill-0", WORKER_ROLE_PREFILL);
  FakeWorkerOptions decode = Worker("decode-0", WORKER_ROLE_DECODE);
  prefill.text = decode.text = "abcd";
  ASSERT_NE(env.AddWorker(prefill), nullptr) << env.last_error();
  ASSERT_NE(env.AddWorker(decode), nullptr) << env.last_error();
  StreamingCall call(env.http_port(), "/v1/completions", kStream);
  // Prefill: the first token after one delay, the transfer after another; then a delay per
  // decode token. Each token must reach the client before time moves on.
  Pass(kDelay);
  ASSERT_TRUE(call.ReadUntil(R"("text":"a")", 5000)) << call.received();
  Pass(kDelay);  // the transfer
  for (const char* text : {R"("text":"b")", R"("text":"c")", R"("text":"d")"}) {
    Pass(kDelay);
    ASSERT_TRUE(call.ReadUntil(text, 5000)) << call.received();
  }
  ASSERT_TRUE(call.ReadUntil("[DONE]", 5000)) << call.received();
  json timings = StreamTimings(call);
  ASSERT_TRUE(timings.is_object()) << call.received();
  EXPECT_DOUBLE_EQ(timings["queue_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(timings["ttft_s"].get<double>(), 0.010);
  EXPECT_DOUBLE_EQ(timings["e2e_s"].get<double>(), 0.050);
  EXPECT_DOUBLE_EQ(timings["kv_transfer_s"].get<double>(), 0.002);  // worker-reported
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().num_live() == 0; }));
  const std::string metrics = HttpCall(env.http_port(), "GET", "/metrics").body;
  EXPECT_DOUBLE_EQ(Sample(metrics, "tandem:time_to_first_token_seconds_sum"), 0.010);
  EXPECT_EQ(Sample(metrics, "tandem:time_to_first_token_seconds_count"), 1);
  // Gaps: 20 ms (transfer + first decode step), then 10 ms twice.
  EXPECT_NEAR(Sample(metrics, "tandem:inter_token_latency_seconds_sum"), 0.040, 1e-12);
  EXPECT_EQ(Sample(metrics, "tandem:inter_token_latency_seconds_count"), 3);
  // Decode time: first token (10 ms) to last (50 ms); per output token after the first: 40 / 3.
  EXPECT_NEAR(Sample(metrics, "tandem:request_decode_time_seconds_sum"), 0.040, 1e-12);
  EXPECT_EQ(Sample(metrics, "tandem:request_decode_time_seconds_count"), 1);
  EXPECT_NEAR(Sample(metrics, "tandem:request_time_per_output_token_seconds_sum"), 0.040 / 3,
              1e-12);
  EXPECT_EQ(Sample(metrics, "tandem:request_time_per_output_token_seconds_count"), 1);
  EXPECT_DOUBLE_EQ(Sample(metrics, "tandem:e2e_request_latency_seconds_sum"), 0.050);
  EXPECT_DOUBLE_EQ(Sample(metrics, "tandem:request_queue_time_seconds_sum"), 0.0);
  EXPECT_EQ(Sample(metrics, "tandem:request_queue_time_seconds_count"), 1);
  // Token histograms: the prompt "x" (BOS + 1 byte) and the 4 tokens generated.
  EXPECT_EQ(Sample(metrics, "tandem:request_prompt_tokens_sum"), 2);
  EXPECT_EQ(Sample(metrics, "tandem:request_generation_tokens_sum"), 4);
  EXPECT_EQ(Sample(metrics, "tandem:request_generation_tokens_count"), 1);
}

TEST_F(RouterClockTest, QueueTimeIsExactlyTheWaitForARunningSlot) {
  RouterConfig config = Config();
  config.max_running = 1;
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorkerOptions mixed = Worker("m", WORKER_ROLE_MIXED);
  mixed.text = "ab";
  FakeWorker* worker = env.AddWorker(mixed);
  ASSERT_NE(worker, nullptr) << env.last_error();
  const std::string two = R"({"prompt": "x", "max_tokens": 2, "stream": true,
                              "stream_options": {"include_usage": true}})";
  StreamingCall first(env.http_port(), "/v1/completions", two);
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return worker->streams_open() == 1; }));
  StreamingCall second(env.http_port(), "/v1/completions", two);
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().admission().waiting() == 1; }));
  Pass(kDelay);
  ASSERT_TRUE(first.ReadUntil(R"("text":"a")", 5000)) << first.received();
  Pass(kDelay);  // the first ends: the second starts now, 20 ms after it arrived
  ASSERT_TRUE(first.ReadUntil("[DONE]", 5000)) << first.received();
  Pass(kDelay);
  ASSERT_TRUE(second.ReadUntil(R"("text":"a")", 5000)) << second.received();
  Pass(kDelay);
  ASSERT_TRUE(second.ReadUntil("[DONE]", 5000)) << second.received();
  json a = StreamTimings(first);
  json b = StreamTimings(second);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_DOUBLE_EQ(a["queue_s"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(a["ttft_s"].get<double>(), 0.010);
  EXPECT_DOUBLE_EQ(a["e2e_s"].get<double>(), 0.020);
  EXPECT_DOUBLE_EQ(b["queue_s"].get<double>(), 0.020);
  EXPECT_DOUBLE_EQ(b["ttft_s"].get<double>(), 0.030);  // from its arrival, queue included
  EXPECT_DOUBLE_EQ(b["e2e_s"].get<double>(), 0.040);
}

TEST_F(RouterClockTest, ReservationRetryBudgetEndsExactlyWhenSpent) {
  RouterConfig config = Config();
  config.flow.reserve_retry_budget = absl::Seconds(1);
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Worker("prefill-0", WORKER_ROLE_PREFILL)), nullptr);
  FakeWorkerOptions full = Worker("decode-full", WORKER_ROLE_DECODE);
  full.refuse_reservations = true;
  FakeWorker* decode = env.AddWorker(full);
  ASSERT_NE(decode, nullptr);
  std::atomic<bool> answered{false};
  HttpResult result;
  std::thread client([&] {
    result = Post(env.http_port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
    answered = true;
  });
  // Refused at once, then retried every 50 ms (the only decode worker: a back-off) until the
  // budget is spent: 1 + 20 attempts, the last exactly at the end of the budget.
  for (int retry = 1; retry <= 20; ++retry) {
    if (!clock_.AwaitWaiterUntil(clock_.Now() + absl::Milliseconds(50))) {
      ADD_FAILURE() << "no retry " << retry << " scheduled";
      break;
    }
    EXPECT_FALSE(answered) << "answered before retry " << retry;
    clock_.Advance(absl::Milliseconds(50));
  }
  if (HasFailure()) clock_.Advance(absl::Hours(1));  // whatever went wrong, let the client go
  client.join();
  EXPECT_EQ(result.status, 429) << result.body;
  EXPECT_THAT(result.body, HasSubstr("within the retry budget"));
  EXPECT_EQ(decode->reservations_refused(), 21);
}

TEST_F(RouterClockTest, StoppedWorkerIsDownAtTheFirstExpiryCheckPastTheLimit) {
  RouterConfig config = Config();
  config.heartbeat_interval_ms = 100;  // checked every 50 ms; down after 3 missed (300 ms)
  config.missed_heartbeats = 3;
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorker* worker = env.AddWorker(Worker("m", WORKER_ROLE_MIXED));
  ASSERT_NE(worker, nullptr);
  // Every heartbeat so far was stamped at the start (fake time has not moved); now they stop.
  worker->Kill();
  const absl::Time start = clock_.Now();
  auto ready = [&] { return HttpCall(env.http_port(), "GET", "/ready").status; };
  for (int check = 1; check <= 6; ++check) {  // checks at 50 .. 300 ms: within the limit
    Pass(absl::Milliseconds(50));
    ASSERT_TRUE(clock_.AwaitWaiterUntil(start + absl::Milliseconds(50 * (check + 1))));
    EXPECT_TRUE(env.server().registry().Snapshot()[0].healthy) << "check " << check;
  }
  EXPECT_EQ(ready(), 200);
  Pass(absl::Milliseconds(50));  // 350 ms: past the limit
  ASSERT_TRUE(clock_.AwaitWaiterUntil(start + absl::Milliseconds(400)));
  EXPECT_FALSE(env.server().registry().Snapshot()[0].healthy);
  EXPECT_EQ(ready(), 503);
}

}  // namespace
}  // namespace tandem::router::testing
