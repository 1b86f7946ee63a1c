// The HTTP front end over persistent connections: thousands of pipelined and of sequential
// keep-alive requests all answered, in order, each within a bound; idle and slow connections
// closed after the idle timeout while a long stream is not; HEAD on every route.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::WORKER_ROLE_DECODE;
using tandem::v1::WORKER_ROLE_PREFILL;
using ::testing::HasSubstr;

constexpr char kCompletion[] = R"({"model": "tiny", "prompt": "hi", "max_tokens": 3})";

class KeepAliveTest : public ::testing::Test {
 protected:
  explicit KeepAliveTest(RouterConfig config = TestRouterConfig()) : env_(config) {}
  void SetUp() override {
    ASSERT_TRUE(env_.status().ok()) << env_.status();
    ASSERT_NE(env_.AddWorker(Role("prefill-0", WORKER_ROLE_PREFILL)), nullptr) << env_.last_error();
    ASSERT_NE(env_.AddWorker(Role("decode-0", WORKER_ROLE_DECODE)), nullptr) << env_.last_error();
    ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env_.server().service().HasUsableWorkers(); }));
  }
  int port() { return env_.http_port(); }

  // Request i of a mixed sequence: every 4th a completion through both fake workers, the others
  // GETs; each carries x-request-id i (echoed, so the order of the answers shows).
  static std::string MixedRequest(int i) {
    const std::string id = absl::StrCat("x-request-id: ", i, "\r\n");
    if (i % 4 == 0) return KeepAliveRequest("POST", "/v1/completions", kCompletion, id);
    return KeepAliveRequest("GET", i % 2 ? "/health" : "/v1/models", "", id);
  }
  static void ExpectAnswers(const std::optional<HttpResult>& r, int i) {
    ASSERT_TRUE(r.has_value()) << "no answer to request " << i << " within 5 s";
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->Header("x-request-id"), std::to_string(i));
    if (i % 4 == 0) {
      EXPECT_THAT(r->body, HasSubstr("\"text\":\"hel\""));
    }
  }

  RouterTestEnv env_;
};

TEST_F(KeepAliveTest, ThousandsOfPipelinedRequestsAreAllAnsweredInOrder) {
  constexpr int kRequests = 3000;
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  // One thread writes every request as fast as it can (the server reads ahead 64 KiB, then
  // pauses), the test reads the answers.
  std::thread sender([&] {
    std::string batch;
    for (int i = 0; i < kRequests; ++i) {
      batch += MixedRequest(i);
      if (batch.size() > 8000 || i + 1 == kRequests) {
        c.Send(batch);
        batch.clear();
      }
    }
  });
  for (int i = 0; i < kRequests; ++i) {
    std::optional<HttpResult> r = c.Read();
    ExpectAnswers(r, i);
    if (!r.has_value() || HasFailure()) break;
  }
  sender.join();
}

TEST_F(KeepAliveTest, ThousandsOfSequentialKeepAliveRequestsNeverHang) {
  constexpr int kRequests = 2000;
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  for (int i = 0; i < kRequests; ++i) {
    // Sent the moment the last byte of the previous answer is read: the next request races the
    // end of the previous response's write on the server.
    ASSERT_TRUE(c.Send(MixedRequest(i)));
    std::optional<HttpResult> r = c.Read();
    ExpectAnswers(r, i);
    if (!r.has_value() || HasFailure()) break;
  }
}

TEST_F(KeepAliveTest, HeadAnswersEveryRouteWithTheHeadersOfGetAndNoBody) {
  struct Route {
    std::string method;  // the method whose answer HEAD must mirror
    std::string path;
  };
  const std::vector<Route> routes = {
      {"GET", "/health"},   {"GET", "/version"},        {"GET", "/ready"},
      {"GET", "/metrics"},  {"GET", "/v1/models"},      {"GET", "/no/such/route"},
      {"GET", "/tokenize"}, {"GET", "/v1/completions"}, {"GET", "/v1/chat/completions"}};
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  for (const Route& route : routes) {
    SCOPED_TRACE(route.path);
    // HEAD, then GET, pipelined: had the HEAD answer a body, the GET's answer would not parse.
    ASSERT_TRUE(c.Send(KeepAliveRequest("HEAD", route.path) + KeepAliveRequest("GET", route.path)));
    std::optional<HttpResult> head = c.Read(/*head=*/true);
    std::optional<HttpResult> get = c.Read();
    ASSERT_TRUE(head.has_value() && get.has_value());
    EXPECT_EQ(head->status, get->status);
    EXPECT_EQ(head->Header("content-type"), get->Header("content-type"));
    ASSERT_FALSE(get->body.empty());
    if (route.path == "/metrics") {  // counters move between the two: a length, not the same
      EXPECT_GT(std::stoul(head->Header("content-length")), 0u);
    } else if (get->status == 405) {  // "method HEAD is not allowed" is one byte longer
      EXPECT_EQ(head->Header("content-length"), std::to_string(get->body.size() + 1));
      EXPECT_EQ(head->Header("allow"), "POST");
    } else {
      EXPECT_EQ(head->Header("content-length"), std::to_string(get->body.size()));
    }
  }
  EXPECT_FALSE(c.ClosedWithin(absl::Milliseconds(100)));
  EXPECT_TRUE(c.pending().empty()) << c.pending();
}

RouterConfig ShortIdleConfig() {
  RouterConfig config = TestRouterConfig();
  config.http_idle_timeout = absl::Milliseconds(500);
  return config;
}

class IdleTimeoutTest : public KeepAliveTest {
 protected:
  IdleTimeoutTest() : KeepAliveTest(ShortIdleConfig()) {}
};

TEST_F(IdleTimeoutTest, IdleAndSlowConnectionsAreClosedAfterTheTimeout) {
  HttpConnection idle;  // finished a request, then nothing
  ASSERT_TRUE(idle.Connect(port()));
  ASSERT_TRUE(idle.Send(KeepAliveRequest("GET", "/health")));
  ASSERT_TRUE(idle.Read().has_value());
  HttpConnection silent;  // never sends a byte
  ASSERT_TRUE(silent.Connect(port()));
  HttpConnection slow;  // half a request (a slowloris)
  ASSERT_TRUE(slow.Connect(port()));
  ASSERT_TRUE(slow.Send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  const absl::Time start = absl::Now();
  EXPECT_TRUE(idle.ClosedWithin(absl::Seconds(3)));
  EXPECT_TRUE(silent.ClosedWithin(absl::Seconds(3)));
  EXPECT_TRUE(slow.ClosedWithin(absl::Seconds(3)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400));  // not before the timeout
}

TEST_F(IdleTimeoutTest, ConnectionInUseIsNotClosed) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  // Requests every 300 ms for 2 s (4x the timeout): each resets it.
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(c.Send(KeepAliveRequest("GET", "/health")));
    ASSERT_TRUE(c.Read().has_value()) << "request " << i;
    absl::SleepFor(absl::Milliseconds(300));
  }
}

TEST(IdleTimeoutStreamTest, AStreamQuieterThanTheTimeoutIsNotCut) {
  RouterTestEnv env(ShortIdleConfig());  // 500 ms; tokens come every 300 ms, ~1.5 s in all
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("mixed-slow", tandem::v1::WORKER_ROLE_MIXED, 300)), nullptr)
      << env.last_error();
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().HasUsableWorkers(); }));
  HttpConnection c;
  ASSERT_TRUE(c.Connect(env.http_port()));
  ASSERT_TRUE(c.Send(
      KeepAliveRequest("POST", "/v1/completions",
                       R"({"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": true})")));
  std::optional<HttpResult> r = c.Read(false, absl::Seconds(10));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_THAT(r->body, HasSubstr("[DONE]"));
  // And the connection is reusable afterwards.
  ASSERT_TRUE(c.Send(KeepAliveRequest("GET", "/health")));
  EXPECT_TRUE(c.Read().has_value());
}

TEST_F(KeepAliveTest, ExpectContinueIsAnsweredAndOversizedBodyRejectedBeforeItIsSent) {
  HttpConnection c;
  ASSERT_TRUE(c.Connect(port()));
  const std::string body = kCompletion;
  ASSERT_TRUE(c.Send(absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
                                  "Content-Type: application/json\r\nExpect: 100-continue\r\n",
                                  "Content-Length: ", body.size(), "\r\n\r\n")));
  std::optional<HttpResult> cont = c.Read();
  ASSERT_TRUE(cont.has_value());
  EXPECT_EQ(cont->status, 100);
  ASSERT_TRUE(c.Send(body));
  std::optional<HttpResult> r = c.Read();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200) << r->body;

  HttpConnection big;  // over --max-body-bytes: 413 at once, no 100
  ASSERT_TRUE(big.Connect(port()));
  ASSERT_TRUE(
      big.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               "Content-Length: 100000000\r\n\r\n"));
  std::optional<HttpResult> refused = big.Read();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 413);
  EXPECT_THAT(refused->body, HasSubstr("\"code\":413"));
  EXPECT_TRUE(big.ClosedWithin(absl::Seconds(3)));
}

}  // namespace
}  // namespace tandem::router::testing
