// Finding 1 of [hardening] on the router: its WorkerRegistry service answers only calls that
// carry the cluster token, and only the instance holding a worker id may renew it. An
// unauthenticated, a wrongly authenticated and a foreign-instance client try to register a
// worker, to take over a registered worker's id, to heartbeat it into draining and to report it
// unhealthy: each fails and the registry is unchanged, and requests keep being served by the
// real workers. Also: worker-side request ids are random 128-bit values, and the gRPC front end
// checks its API key (any case of "Bearer") on ListModels as on Generate.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <regex>

#include "rpc/cluster_auth.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::WorkerRegistry;

std::unique_ptr<grpc::ClientContext> Context() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return c;
}

const WorkerSnapshot* Find(const std::vector<WorkerSnapshot>& all, const std::string& id) {
  for (const WorkerSnapshot& w : all) {
    if (w.id == id) return &w;
  }
  return nullptr;
}

tandem::v1::RegisterRequest Hello(const std::string& id, const std::string& instance) {
  tandem::v1::RegisterRequest r;
  r.set_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
  r.set_worker_id(id);
  r.set_instance_id(instance);
  r.set_role(tandem::v1::WORKER_ROLE_DECODE);
  r.set_address("127.0.0.1:1");  // an impostor's address: it would receive users' prompts
  r.set_kv_transfer_address("127.0.0.1:1");
  return r;
}

// Serves one request through the gRPC front end; its text ("hello" from the fake workers).
std::string ServeOne(RouterTestEnv& env, const std::string& api_key = "") {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(env.grpc_address(), grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest request;
  request.set_prompt("hi");
  request.mutable_sampling()->set_max_tokens(5);
  auto ctx = Context();
  if (!api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + api_key);
  auto reader = stub->Generate(ctx.get(), request);
  std::string text;
  tandem::v1::GenerateResponse response;
  while (reader->Read(&response)) text += response.text();
  grpc::Status st = reader->Finish();
  return st.ok() ? text : "error: " + st.error_message();
}

TEST(ControlPlaneAuthTest, RegistryRefusesCallsWithoutTheClusterToken) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_FALSE(env.cluster_token().empty());
  ASSERT_NE(env.AddWorker(Role("p0", tandem::v1::WORKER_ROLE_PREFILL)), nullptr);
  ASSERT_NE(env.AddWorker(Role("d0", tandem::v1::WORKER_ROLE_DECODE)), nullptr);
  const std::vector<WorkerSnapshot> before = env.server().registry().Snapshot();
  const WorkerSnapshot* d0 = Find(before, "d0");
  ASSERT_NE(d0, nullptr);

  // Both methods of the service are tried; a new one must be added here.
  ASSERT_EQ(tandem::v1::RegisterRequest::descriptor()
                ->file()
                ->FindServiceByName("WorkerRegistry")
                ->method_count(),
            2);
  for (const std::string& token : {std::string(), std::string("not-the-router-test-token")}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    auto stub = WorkerRegistry::NewStub(
        ClusterChannel(env.grpc_address(), token, ControlPlaneChannelArgs()));
    tandem::v1::RegisterResponse reg;
    // A new worker, and a take-over of d0's id by the same instance id (as if it were d0).
    for (const auto& hello : {Hello("impostor", "x"), Hello("d0", "fake-instance")}) {
      EXPECT_EQ(stub->Register(Context().get(), hello, &reg).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    // Heartbeats that would drain d0 or mark it down.
    tandem::v1::HeartbeatRequest hb;
    hb.set_worker_id("d0");
    hb.set_instance_id("fake-instance");
    hb.set_epoch(d0->epoch);
    hb.set_draining(true);
    tandem::v1::HeartbeatResponse hbr;
    EXPECT_EQ(stub->Heartbeat(Context().get(), hb, &hbr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    hb.set_unhealthy_reason("forged");
    EXPECT_EQ(stub->Heartbeat(Context().get(), hb, &hbr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // With the token, but from another instance than d0's.
  auto authed = WorkerRegistry::NewStub(
      ClusterChannel(env.grpc_address(), env.cluster_token(), ControlPlaneChannelArgs()));
  tandem::v1::RegisterResponse reg;
  EXPECT_EQ(authed->Register(Context().get(), Hello("d0", "other-instance"), &reg).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  tandem::v1::RegisterRequest no_instance = Hello("d1", "");
  EXPECT_EQ(authed->Register(Context().get(), no_instance, &reg).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("d0");
  hb.set_instance_id("other-instance");
  hb.set_epoch(d0->epoch);
  hb.set_draining(true);
  tandem::v1::HeartbeatResponse hbr;
  EXPECT_EQ(authed->Heartbeat(Context().get(), hb, &hbr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  hb.set_unhealthy_reason("forged");
  EXPECT_EQ(authed->Heartbeat(Context().get(), hb, &hbr).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Nothing changed: the same two workers, same epochs and addresses, healthy, not draining
  // (for longer than a few of their heartbeats, which would not undo a forged drain flag before
  // the next one: the fake workers report draining = false).
  absl::SleepFor(absl::Milliseconds(50));
  const std::vector<WorkerSnapshot> after = env.server().registry().Snapshot();
  ASSERT_EQ(after.size(), before.size());
  for (const WorkerSnapshot& w : before) {
    const WorkerSnapshot* now = Find(after, w.id);
    ASSERT_NE(now, nullptr) << w.id;
    EXPECT_EQ(now->epoch, w.epoch) << w.id;
    EXPECT_EQ(now->address, w.address) << w.id;
    EXPECT_TRUE(now->healthy) << w.id;
    EXPECT_FALSE(now->draining) << w.id;
  }
  EXPECT_EQ(ServeOne(env), "hello");
}

// A worker that restarted (a new instance) takes its id back once the router noticed the old
// instance is gone (missed heartbeats), not before.
TEST(ControlPlaneAuthTest, ANewInstanceTakesTheIdOnlyOnceTheOldOneIsDown) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorker* old = env.AddWorker(Role("m0", tandem::v1::WORKER_ROLE_MIXED));
  ASSERT_NE(old, nullptr);
  FakeWorkerOptions next = Role("m0", tandem::v1::WORKER_ROLE_MIXED);
  next.instance_id = "second-instance";
  EXPECT_EQ(env.AddWorker(next), nullptr);
  EXPECT_EQ(env.last_error().code(), absl::StatusCode::kAlreadyExists);
  old->Kill();
  // 3 missed heartbeats of 100 ms, checked every 50 ms.
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return !env.server().registry().Snapshot()[0].healthy; },
                                     absl::Seconds(2)));
  ASSERT_NE(env.AddWorker(next), nullptr) << env.last_error();
  EXPECT_EQ(ServeOne(env), "hello");
}

TEST(ControlPlaneAuthTest, WorkerRequestIdsAreRandom128BitValues) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  FakeWorker* worker = env.AddWorker(Role("m0", tandem::v1::WORKER_ROLE_MIXED));
  ASSERT_NE(worker, nullptr);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(ServeOne(env), "hello");
  const std::vector<std::string> ids = worker->request_ids();
  ASSERT_EQ(ids.size(), 3u);
  for (const std::string& id : ids) {
    EXPECT_TRUE(std::regex_match(id, std::regex("r[0-9a-f]{32}"))) << id;
  }
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
}

TEST(ControlPlaneAuthTest, GrpcListModelsNeedsTheApiKeyInAnyCaseOfBearer) {
  RouterConfig config = TestRouterConfig();
  config.api_key = "sekrit-key";
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("m0", tandem::v1::WORKER_ROLE_MIXED)), nullptr);
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(env.grpc_address(), grpc::InsecureChannelCredentials()));
  auto list = [&](const std::string& authorization) {
    auto ctx = Context();
    if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
    tandem::v1::ListModelsResponse response;
    grpc::Status st = stub->ListModels(ctx.get(), tandem::v1::ListModelsRequest(), &response);
    EXPECT_EQ(st.ok(), response.models_size() == 1);
    return st.error_code();
  };
  EXPECT_EQ(list(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("Bearer sekrit-kez"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("Bearer sekrit-key2"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("Bearer sekrit-ke"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("Basic sekrit-key"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("sekrit-key"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(list("Bearer sekrit-key"), grpc::StatusCode::OK);
  EXPECT_EQ(list("bearer sekrit-key"), grpc::StatusCode::OK);
  EXPECT_EQ(list("BEARER sekrit-key"), grpc::StatusCode::OK);
  EXPECT_THAT(ServeOne(env), ::testing::HasSubstr("API key"));
  EXPECT_EQ(ServeOne(env, "sekrit-key"), "hello");
}

}  // namespace
}  // namespace tandem::router::testing
