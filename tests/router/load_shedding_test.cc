// Load shedding over HTTP against fake workers: admission bounded by the KV the workers can
// hold, 429 + Retry-After for a request that waits past --max-queue-time, the rest served.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::WORKER_ROLE_MIXED;
using ::testing::HasSubstr;

TEST(LoadSheddingTest, AdmissionFollowsTheWorkersKvCapacity) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorkerOptions small = Role("m", WORKER_ROLE_MIXED, /*token_delay_ms=*/20);
  small.num_pages = 2;  // 2 pages of 16 tokens: one request of 3 + 20 tokens at a time
  ASSERT_NE(env.AddWorker(small), nullptr) << env.last_error();
  ASSERT_EQ(KvTokenCapacity(env.server().registry().Snapshot()), 32);
  const std::string body = R"({"prompt": "hi", "max_tokens": 20, "stream": true})";
  StreamingCall first(env.http_port(), "/v1/completions", body);
  ASSERT_TRUE(first.ReadUntil("data:", 3000));
  StreamingCall second(env.http_port(), "/v1/completions", body);
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().admission().waiting() == 1; }))
      << "the second request should wait: 46 tokens do not fit in 32; capacity "
      << KvTokenCapacity(env.server().registry().Snapshot()) << ", running "
      << env.server().admission().running() << " holding "
      << env.server().admission().running_kv_tokens();
  EXPECT_EQ(env.server().admission().running(), 1);
  EXPECT_TRUE(first.ReadUntil("[DONE]", 5000));
  EXPECT_TRUE(second.ReadUntil("[DONE]", 5000)) << second.received();
}

TEST(LoadSheddingTest, OverloadGets429WithRetryAfterWithinTheQueueTimeBound) {
  RouterConfig config = TestRouterConfig();
  config.max_running = 2;
  config.max_queue_time = absl::Milliseconds(300);
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED, /*token_delay_ms=*/100)), nullptr);
  // 2 running streams take ~1.5 s each; 10 more arrive at once (6x the capacity).
  const std::string slow = R"({"prompt": "x", "max_tokens": 12, "stream": true})";
  StreamingCall a(env.http_port(), "/v1/completions", slow);
  StreamingCall b(env.http_port(), "/v1/completions", slow);
  ASSERT_TRUE(a.ReadUntil("data:", 3000) && b.ReadUntil("data:", 3000));
  std::vector<std::unique_ptr<StreamingCall>> extra;
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) {
    extra.push_back(std::make_unique<StreamingCall>(env.http_port(), "/v1/completions", slow));
  }
  for (auto& call : extra) {
    ASSERT_TRUE(call->ReadUntil("\r\n\r\n", 3000)) << call->received();
    EXPECT_THAT(call->received(), HasSubstr("HTTP/1.1 429"));
    EXPECT_THAT(call->received(), HasSubstr("Retry-After: 1"));
    EXPECT_THAT(call->received(), HasSubstr("max-queue-time"));
  }
  // Rejected after the bound (300 ms, checked every 50 ms), long before a slot freed (~1.5 s).
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1000));
  EXPECT_TRUE(a.ReadUntil("[DONE]", 5000));
  EXPECT_TRUE(b.ReadUntil("[DONE]", 5000));
  EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().num_live() == 0; }));
  EXPECT_EQ(env.server().admission().running(), 0);
}

}  // namespace
}  // namespace tandem::router::testing
