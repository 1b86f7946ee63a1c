// Finding 4 of [hardening]: a failed KV transfer is attributed by who reported what. A worker
// that answers "my transfer with the other worker failed" (rpc/peer_fault.h) is up: the router
// fails the request (503 / UNAVAILABLE, one terminal answer) but marks nobody down on that
// word, so one bad worker cannot take the healthy ones out of rotation. A worker that does not
// answer at all is still marked down at once (RouterHttpTest's kill tests).
#include <gtest/gtest.h>

#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

int Healthy(RouterServer& server, tandem::v1::WorkerRole role) {
  int n = 0;
  for (const WorkerSnapshot& w : server.registry().Snapshot()) n += w.role == role && w.healthy;
  return n;
}

std::string Completion(int max_tokens) {
  return R"({"model": "tiny", "prompt": "hi", "max_tokens": )" + std::to_string(max_tokens) + "}";
}

// Two healthy prefill workers and one decode worker whose transfers fail, as the prefill
// workers report: every request fails cleanly, and both prefill workers (and the decode worker,
// whose heartbeats are fine) stay in rotation. A working decode worker added later serves.
TEST(FailureAttributionTest, PrefillBlamingDecodeMarksNoPrefillDown) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  for (const char* id : {"p0", "p1"}) {
    FakeWorkerOptions o = Role(id, tandem::v1::WORKER_ROLE_PREFILL);
    o.transfer_fails = true;  // the prefill worker says: the decode side failed the transfer
    ASSERT_NE(env.AddWorker(o), nullptr);
  }
  ASSERT_NE(env.AddWorker(Role("d0", tandem::v1::WORKER_ROLE_DECODE)), nullptr);
  for (int i = 0; i < 6; ++i) {
    HttpResult r = Post(env.http_port(), "/v1/completions", Completion(4));
    EXPECT_EQ(r.status, 503) << r.body;
    EXPECT_NE(r.body.find("KV transfer to decode failed"), std::string::npos) << r.body;
  }
  EXPECT_EQ(Healthy(env.server(), tandem::v1::WORKER_ROLE_PREFILL), 2);
  EXPECT_EQ(Healthy(env.server(), tandem::v1::WORKER_ROLE_DECODE), 1);
}

// The decode worker reports the prefill worker's transfer failed: neither is marked down, and
// the flows end cleanly; with a good decode worker the same prefill workers serve.
TEST(FailureAttributionTest, DecodeBlamingPrefillMarksNoDecodeDown) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("p0", tandem::v1::WORKER_ROLE_PREFILL)), nullptr);
  FakeWorkerOptions bad = Role("d0", tandem::v1::WORKER_ROLE_DECODE);
  bad.transfer_fails = true;
  FakeWorker* d0 = env.AddWorker(bad);
  ASSERT_NE(d0, nullptr);
  for (int i = 0; i < 4; ++i) {
    HttpResult r = Post(env.http_port(), "/v1/completions", Completion(4));
    EXPECT_EQ(r.status, 503) << r.body;
  }
  EXPECT_EQ(Healthy(env.server(), tandem::v1::WORKER_ROLE_PREFILL), 1);
  EXPECT_EQ(Healthy(env.server(), tandem::v1::WORKER_ROLE_DECODE), 1);
  EXPECT_EQ(d0->reservations_held(), 0);
  d0->Kill();
  ASSERT_TRUE(RouterTestEnv::WaitFor(
      [&] { return Healthy(env.server(), tandem::v1::WORKER_ROLE_DECODE) == 0; }));
  ASSERT_NE(env.AddWorker(Role("d1", tandem::v1::WORKER_ROLE_DECODE)), nullptr);
  HttpResult ok = Post(env.http_port(), "/v1/completions", Completion(4));
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Healthy(env.server(), tandem::v1::WORKER_ROLE_PREFILL), 1);
}

}  // namespace
}  // namespace tandem::router::testing
