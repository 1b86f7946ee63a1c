// A prefill that sends nothing for longer than the control plane's keepalive allows (its 5 s
// pings, rpc/cluster_auth.h) still completes through the router: the worker's server accepts
// those pings on a stream without data (ApplyControlPlaneServerArgs, as run_worker.cc applies).
// Under gRPC's default server policy a prefill as slow is cut with GOAWAY "too_many_pings"
// after three pings (the router's stream fails: "Too many pings"), which is what broke multi-turn
// measurements on a loaded CPU before the workers' servers took the policy.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tandem/v1/generate.grpc.pb.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

// Past four of the router's 5 s keepalive pings: gRPC's default server refuses the third (on
// the stream's connection, or first on an idle one, after which the client pings half as often:
// the reproduction waits for eight).
constexpr int kSlowPrefillMs = 23000;
constexpr int kReproPrefillMs = 40000;

grpc::Status GenerateOnce(const std::string& address, std::string* text) {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(90));
  tandem::v1::GenerateRequest request;
  request.set_prompt("hi");
  request.mutable_sampling()->set_max_tokens(3);
  auto reader = stub->Generate(&context, request);
  tandem::v1::GenerateResponse response;
  while (reader->Read(&response)) *text += response.text();
  return reader->Finish();
}

grpc::Status SlowPrefill(bool control_plane_server_args, int prefill_ms, std::string* text) {
  RouterTestEnv env;
  if (!env.status().ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "no router");
  FakeWorkerOptions prefill = Role("p", tandem::v1::WORKER_ROLE_PREFILL);
  prefill.prefill_delay_ms = prefill_ms;
  prefill.control_plane_server_args = control_plane_server_args;
  FakeWorkerOptions decode = Role("d", tandem::v1::WORKER_ROLE_DECODE);
  decode.control_plane_server_args = control_plane_server_args;
  if (env.AddWorker(prefill) == nullptr || env.AddWorker(decode) == nullptr) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "no workers");
  }
  return GenerateOnce(env.grpc_address(), text);
}

TEST(SlowPrefillTest, CompletesThroughTheRouterWithTheWorkersKeepalivePolicy) {
  std::string text;
  grpc::Status status = SlowPrefill(/*control_plane_server_args=*/true, kSlowPrefillMs, &text);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(text, "hel");
}

// The reproduction: without the policy the stream is cut, the request fails.
TEST(SlowPrefillTest, FailsWithTooManyPingsUnderGrpcsDefaultServerPolicy) {
  std::string text;
  grpc::Status status = SlowPrefill(/*control_plane_server_args=*/false, kReproPrefillMs, &text);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_message().find("ping"), std::string::npos) << status.error_message();
}

}  // namespace
}  // namespace tandem::router::testing
