#include "worker/metrics_http_server.h"

#include <prometheus/counter.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/listen_error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/http/http_connection.h"
#include "worker/worker_metrics.h"

namespace tandem {
namespace {

using ::tandem::testing::HttpConnection;
using ::tandem::testing::HttpGetOnce;
using ::tandem::testing::HttpResult;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

std::string Get(const std::string& path) {
  return "GET " + path + " HTTP/1.1\r\nHost: localhost\r\n\r\n";
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer({}); }

  void StartServer(MetricsHttpServer::Options options) {
    registry_ = std::make_shared<prometheus::Registry>();
    counter_ = &prometheus::BuildCounter()
                    .Name("tandem_test_events_total")
                    .Help("Events seen by the test")
                    .Register(*registry_)
                    .Add({{"kind", "scrape"}});
    counter_->Increment(3);
    server_.reset();
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start(options, registry_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    ASSERT_GT(server_->port(), 0);
  }

  int port() const { return server_->port(); }

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* counter_ = nullptr;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(MetricsHttpServerTest, GetServesTheRegistryAtEachScrape) {
  std::optional<HttpResult> r = HttpGetOnce(port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->Header("Content-Type"), kContentType);
  EXPECT_EQ(r->Header("Content-Length"), std::to_string(r->body.size()));
  EXPECT_THAT(r->body, HasSubstr("# TYPE tandem_test_events_total counter\n"));
  EXPECT_THAT(r->body, HasSubstr("tandem_test_events_total{kind=\"scrape\"} 3\n"));

  counter_->Increment(2);
  r = HttpGetOnce(port(), "/metrics?name=ignored");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("tandem_test_events_total{kind=\"scrape\"} 5\n"));
}

TEST_F(MetricsHttpServerTest, HeadSendsTheHeadersOfGetAndNoBody) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(c.Send(Get("/metrics")));
  std::optional<HttpResult> get = c.Read();
  ASSERT_TRUE(get.has_value());
  ASSERT_EQ(get->status, 200);

  ASSERT_TRUE(c.Send("HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  std::optional<HttpResult> head = c.Read(/*head=*/true);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->Header("Content-Type"), kContentType);
  EXPECT_EQ(head->Header("Content-Length"), std::to_string(get->body.size()));
  // Nothing follows the headers, and the connection stays open: the next bytes are the next
  // response's.
  EXPECT_EQ(c.ReadFor(absl::Milliseconds(300)), "");
  ASSERT_TRUE(c.Send(Get("/metrics")));
  EXPECT_THAT(c.ReadFor(absl::Milliseconds(300)), StartsWith("HTTP/1.1 200 OK\r\n"));
}

TEST_F(MetricsHttpServerTest, HealthAndReadyFollowTheProbes) {
  auto status_of = [&](const char* path) {
    std::optional<HttpResult> r = HttpGetOnce(port(), path);
    return r.has_value() ? r->status : -1;
  };
  // Before SetProbes: alive, not ready.
  EXPECT_EQ(status_of("/health"), 200);
  EXPECT_EQ(status_of("/ready"), 503);
  std::atomic<bool> ready{false};
  std::atomic<bool> broken{false};
  server_->SetProbes(
      [&] { return broken ? absl::InternalError("engine failed for good") : absl::OkStatus(); },
      [&] { return ready.load(); });
  EXPECT_EQ(status_of("/health"), 200);
  EXPECT_EQ(status_of("/ready"), 503);
  ready = true;
  EXPECT_EQ(status_of("/ready"), 200);
  EXPECT_EQ(status_of("/ready?verbose=1"), 200);
  // A broken engine: not alive, and not ready even if the ready probe says so.
  broken = true;
  std::optional<HttpResult> health = HttpGetOnce(port(), "/health");
  ASSERT_TRUE(health.has_value());
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, HasSubstr("engine failed for good"));
  EXPECT_EQ(status_of("/ready"), 503);
  // HEAD: the same status, no body; the connection stays usable.
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(c.Send("HEAD /health HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  std::optional<HttpResult> head = c.Read(/*head=*/true);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 503);
  EXPECT_EQ(c.ReadFor(absl::Milliseconds(200)), "");
  server_->SetProbes(nullptr, nullptr);  // cleared: back to the defaults
  EXPECT_EQ(status_of("/health"), 200);
  EXPECT_EQ(status_of("/ready"), 503);
}

TEST_F(MetricsHttpServerTest, UnknownPathIs404) {
  for (const char* path : {"/", "/metricsx", "/metrics/", "/v1/models"}) {
    std::optional<HttpResult> r = HttpGetOnce(port(), path);
    ASSERT_TRUE(r.has_value()) << path;
    EXPECT_EQ(r->status, 404) << path;
    EXPECT_THAT(r->body, Not(HasSubstr("tandem_test_events_total"))) << path;
  }
  HttpConnection c;  // HEAD of a missing page: 404, still no body
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(c.Send("HEAD /nope HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  std::optional<HttpResult> head = c.Read(/*head=*/true);
  ASSERT_TRUE(head.has_value());
  EXPECT_EQ(head->status, 404);
  EXPECT_EQ(c.ReadFor(absl::Milliseconds(200)), "");
}

TEST_F(MetricsHttpServerTest, OtherMethodsAre405AndTheConnectionStaysUsable) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(
      c.Send("POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello"));
  std::optional<HttpResult> post = c.Read();
  ASSERT_TRUE(post.has_value());
  EXPECT_EQ(post->status, 405);
  EXPECT_EQ(post->Header("Allow"), "GET, HEAD");
  ASSERT_TRUE(c.Send("DELETE /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  std::optional<HttpResult> del = c.Read();
  ASSERT_TRUE(del.has_value());
  EXPECT_EQ(del->status, 405);
  ASSERT_TRUE(c.Send(Get("/metrics")));  // the POST body was consumed, not taken as a request
  std::optional<HttpResult> get = c.Read();
  ASSERT_TRUE(get.has_value());
  EXPECT_EQ(get->status, 200);
}

TEST_F(MetricsHttpServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(c.Send(Get("/metrics")));
  std::optional<HttpResult> first = c.Read();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->status, 200);
  EXPECT_NE(first->Header("Connection"), "close");
  counter_->Increment();
  ASSERT_TRUE(c.Send(Get("/metrics")));
  std::optional<HttpResult> second = c.Read();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->status, 200);
  EXPECT_THAT(second->body, HasSubstr("tandem_test_events_total{kind=\"scrape\"} 4\n"));
  // Two pipelined requests in one write: two responses, in order.
  ASSERT_TRUE(c.Send(Get("/metrics") + Get("/nope")));
  std::optional<HttpResult> a = c.Read();
  std::optional<HttpResult> b = c.Read();
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(b->status, 404);
  EXPECT_FALSE(c.ClosedWithin(absl::Milliseconds(200)));
}

TEST_F(MetricsHttpServerTest, ConnectionCloseAndHttp10CloseAfterTheResponse) {
  for (const std::string& request :
       {std::string("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        std::string("GET /metrics HTTP/1.0\r\n\r\n")}) {
    HttpConnection c;
    ASSERT_TRUE(c.Connect(port()));
    ASSERT_TRUE(c.Send(request));
    std::optional<HttpResult> r = c.Read();
    ASSERT_TRUE(r.has_value()) << request;
    EXPECT_EQ(r->status, 200) << request;
    EXPECT_TRUE(c.ClosedWithin(absl::Seconds(2))) << request;
  }
}

TEST_F(MetricsHttpServerTest, MalformedRequestIs400ThenClosed) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  ASSERT_TRUE(c.Send("this is not http\r\n\r\n"));
  std::optional<HttpResult> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(c.ClosedWithin(absl::Seconds(2)));
}

TEST_F(MetricsHttpServerTest, IdleOrSlowConnectionsDoNotBlockAnotherClient) {
  HttpConnection idle;  // connected, sends nothing
  ASSERT_TRUE(idle.Connect(port()));
  HttpConnection slow;  // half a request
  ASSERT_TRUE(slow.Connect(port()));
  ASSERT_TRUE(slow.Send("GET /metr"));
  const absl::Time start = absl::Now();
  std::optional<HttpResult> r = HttpGetOnce(port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // The slow one is still served once it finishes its request.
  ASSERT_TRUE(slow.Send("ics HTTP/1.1\r\nHost: localhost\r\n\r\n"));
  std::optional<HttpResult> late = slow.Read();
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->status, 200);
}

TEST_F(MetricsHttpServerTest, ReadTimeoutClosesIdleAndSlowConnections) {
  StartServer({.read_timeout = absl::Milliseconds(200)});
  HttpConnection idle;
  ASSERT_TRUE(idle.Connect(port()));
  HttpConnection slow;
  ASSERT_TRUE(slow.Connect(port()));
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\n"));  // headers never end
  HttpConnection kept;                                  // idle after a response (keep-alive)
  ASSERT_TRUE(kept.Connect(port()));
  ASSERT_TRUE(kept.Send(Get("/metrics")));
  ASSERT_TRUE(kept.Read().has_value());
  EXPECT_TRUE(idle.ClosedWithin(absl::Seconds(3)));
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(3)));
  EXPECT_TRUE(kept.ClosedWithin(absl::Seconds(3)));
}

TEST_F(MetricsHttpServerTest, ConnectionsBeyondTheCapAreClosed) {
  StartServer({.max_connections = 1});
  HttpConnection first;
  ASSERT_TRUE(first.Connect(port()));
  ASSERT_TRUE(first.Send(Get("/metrics")));  // served: the server holds this connection
  ASSERT_TRUE(first.Read().has_value());
  HttpConnection second;
  ASSERT_TRUE(second.Connect(port()));  // the kernel accepts; the server closes it
  EXPECT_TRUE(second.ClosedWithin(absl::Seconds(2)));
  first.Close();
  // Once the server has seen the first one go, a new connection is served again.
  std::optional<HttpResult> r;
  for (int i = 0; i < 50 && !r.has_value(); ++i) {
    r = HttpGetOnce(port(), "/metrics");
    if (!r.has_value()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST_F(MetricsHttpServerTest, StopReturnsPromptlyWithOpenConnections) {
  HttpConnection idle;
  ASSERT_TRUE(idle.Connect(port()));
  HttpConnection kept;
  ASSERT_TRUE(kept.Connect(port()));
  ASSERT_TRUE(kept.Send(Get("/metrics")));
  ASSERT_TRUE(kept.Read().has_value());
  HttpConnection slow;
  ASSERT_TRUE(slow.Connect(port()));
  ASSERT_TRUE(slow.Send("GET /metrics HTTP/1.1\r\n"));
  const int stopped_port = port();
  const absl::Time start = absl::Now();
  server_->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_TRUE(idle.ClosedWithin(absl::Seconds(1)));
  EXPECT_TRUE(kept.ClosedWithin(absl::Seconds(1)));
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(1)));
  HttpConnection late;
  EXPECT_FALSE(late.Connect(stopped_port));  // no longer listening
  server_->Stop();                           // idempotent
}

TEST_F(MetricsHttpServerTest, PortTakenIsReportedAsPortTaken) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start({.port = port()}, registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(IsPortTaken(second.status())) << second.status();
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  // The worker's path: WorkerMetrics::Create on a taken port.
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics =
      WorkerMetrics::Create("127.0.0.1", port(), "decode", "decode-0", "m");
  ASSERT_FALSE(metrics.ok());
  EXPECT_TRUE(IsPortTaken(metrics.status())) << metrics.status();
  // The first server is unharmed.
  std::optional<HttpResult> r = HttpGetOnce(port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

TEST(MetricsHttpServerStartTest, BadHostOrPortIsInvalidArgument) {
  auto registry = std::make_shared<prometheus::Registry>();
  for (const MetricsHttpServer::Options& o :
       {MetricsHttpServer::Options{.host = "not an address!", .port = 0},
        MetricsHttpServer::Options{.host = "127.0.0.1", .port = -1},
        MetricsHttpServer::Options{.host = "127.0.0.1", .port = 65536}}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s = MetricsHttpServer::Start(o, registry);
    ASSERT_FALSE(s.ok()) << o.host << ":" << o.port;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << s.status();
    EXPECT_FALSE(IsPortTaken(s.status()));
  }
}

TEST(WorkerMetricsTest, ServesTheWorkerFamiliesWithTheirLabels) {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m =
      WorkerMetrics::Create("127.0.0.1", 0, "decode", "decode-7", "tiny");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GT((*m)->port(), 0);
  (*m)->CountRequestOutcome("stop");
  (*m)->ObserveKvTransfer(0.25, 4096, "nccl");
  (*m)->ObserveKvExposed(0.5);  // a receiver has no exposed time: nothing exported
  (*m)->SetKvTransport("auto");
  (*m)->SetKvCache("fp8", 16, 1234);
  std::optional<HttpResult> r = HttpGetOnce((*m)->port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_requests_total{model_name=\"tiny\",role=\"decode\","
                                 "worker=\"decode-7\",finished_reason=\"stop\"} 1\n"));
  EXPECT_THAT(r->body, HasSubstr("tandem:num_requests_running{model_name=\"tiny\","));
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_cache_info{model_name=\"tiny\",role=\"decode\","
                                 "worker=\"decode-7\",kv_cache_dtype=\"fp8\",page_size=\"16\"} "
                                 "1234\n"));
  // A decode worker receives KV pages; a prefill worker sends them.
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_receive_seconds_count{"));
  EXPECT_THAT(r->body, Not(HasSubstr("tandem_worker_kv_send")));
  // Which data path each transfer took, and the configured transport.
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_receive_transfers_total{model_name=\"tiny\","
                                 "role=\"decode\",worker=\"decode-7\",path=\"nccl\"} 1\n"));
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_transport_info{model_name=\"tiny\","
                                 "role=\"decode\",worker=\"decode-7\",kv_transport=\"auto\"} 1\n"));
  EXPECT_THAT(r->body, Not(HasSubstr("exposed")));
}

// A prefill worker sends the pages and says how much of each transfer its compute did not hide.
TEST(WorkerMetricsTest, PrefillWorkersExportTheExposedTransferTime) {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m =
      WorkerMetrics::Create("127.0.0.1", 0, "prefill", "prefill-2", "tiny");
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->ObserveKvTransfer(0.25, 4096, "ipc");
  (*m)->ObserveKvExposed(0.001);
  (*m)->ObserveKvExposed(0.003);
  std::optional<HttpResult> r = HttpGetOnce((*m)->port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  const std::string labels = "{model_name=\"tiny\",role=\"prefill\",worker=\"prefill-2\"}";
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_send_exposed_seconds_count" + labels + " 2\n"));
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_send_exposed_seconds_sum" + labels + " 0.004"));
  EXPECT_THAT(r->body, HasSubstr("tandem_worker_kv_send_seconds_count" + labels + " 1\n"));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The engine's speculative-decoding counters reach Prometheus as counters (deltas between
// updates) and the two ratios as gauges.
TEST(WorkerMetricsTest, ExportsSpeculativeDecodingCounters) {
  absl::StatusOr<std::unique_ptr<WorkerMetrics>> m =
      WorkerMetrics::Create("127.0.0.1", 0, "decode", "decode-1", "tiny");
  ASSERT_TRUE(m.ok()) << m.status();
  EngineStats s;
  s.spec_decode_num_drafts = 10;
  s.spec_decode_num_draft_tokens = 40;
  s.spec_decode_num_accepted_tokens = 30;
  s.spec_decode_num_emitted_tokens = 38;
  (*m)->UpdateEngine(s, 0);
  s.spec_decode_num_drafts = 20;
  s.spec_decode_num_draft_tokens = 80;
  s.spec_decode_num_accepted_tokens = 40;
  s.spec_decode_num_emitted_tokens = 58;
  (*m)->UpdateEngine(s, 0);
  std::optional<testing::HttpResult> r = testing::HttpGetOnce((*m)->port(), "/metrics");
  ASSERT_TRUE(r.has_value());
  const std::string labels = "{model_name=\"tiny\",role=\"decode\",worker=\"decode-1\"}";
  EXPECT_THAT(r->body,
              ::testing::HasSubstr("tandem:spec_decode_num_drafts_total" + labels + " 20\n"));
  EXPECT_THAT(r->body,
              ::testing::HasSubstr("tandem:spec_decode_num_draft_tokens_total" + labels + " 80\n"));
  EXPECT_THAT(r->body, ::testing::HasSubstr("tandem:spec_decode_num_accepted_tokens_total" +
                                            labels + " 40\n"));
  EXPECT_THAT(r->body, ::testing::HasSubstr("tandem:spec_decode_num_emitted_tokens_total" + labels +
                                            " 58\n"));
  EXPECT_THAT(r->body,
              ::testing::HasSubstr("tandem:spec_decode_draft_acceptance_rate" + labels + " 0.5\n"));
  EXPECT_THAT(r->body, ::testing::HasSubstr("tandem_worker_spec_decode_mean_accepted_length" +
                                            labels + " 2.9\n"));
}

}  // namespace
}  // namespace tandem
