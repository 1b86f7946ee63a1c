// The public gRPC Generation API: the same results and errors as the HTTP API.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "tandem/v1/generate.grpc.pb.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::GenerateRequest;
using tandem::v1::GenerateResponse;

struct GrpcResult {
  grpc::Status status;
  std::vector<GenerateResponse> responses;
  std::string text;
};

GrpcResult Generate(const std::string& address, const GenerateRequest& request,
                    const std::string& api_key = "") {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  if (!api_key.empty()) context.AddMetadata("authorization", "Bearer " + api_key);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  GrpcResult result;
  auto reader = stub->Generate(&context, request);
  GenerateResponse response;
  while (reader->Read(&response)) {
    result.text += response.text();
    result.responses.push_back(response);
  }
  result.status = reader->Finish();
  return result;
}

TEST(RouterGrpcTest, StreamsTokensThenOneTerminalMessage) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("p", tandem::v1::WORKER_ROLE_PREFILL)), nullptr);
  ASSERT_NE(env.AddWorker(Role("d", tandem::v1::WORKER_ROLE_DECODE)), nullptr);
  GenerateRequest request;
  request.set_request_id("client-1");
  request.set_prompt("hi");
  request.mutable_sampling()->set_max_tokens(5);
  GrpcResult r = Generate(env.grpc_address(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.text, "hello");
  ASSERT_FALSE(r.responses.empty());
  const GenerateResponse& last = r.responses.back();
  EXPECT_EQ(last.finish_reason(), tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().completion_tokens(), 5);
  EXPECT_EQ(last.usage().prompt_tokens(), 3);
  EXPECT_GT(last.timings().ttft_s(), 0);
  EXPECT_GT(last.timings().kv_transfer_s(), 0);  // reported by the (fake) prefill worker
  EXPECT_EQ(last.request_id(), "client-1");
  int token_count = 0;
  for (const GenerateResponse& m : r.responses) {
    token_count += m.token_ids_size();
    if (&m != &last) {
      EXPECT_EQ(m.finish_reason(), tandem::v1::FINISH_REASON_UNSPECIFIED);
    }
  }
  EXPECT_EQ(token_count, 5);

  request.clear_prompt();
  request.mutable_messages()->add_messages()->set_content("yo");
  request.mutable_messages()->mutable_messages(0)->set_role("user");
  r = Generate(env.grpc_address(), request);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.text, "hello");
}

TEST(RouterGrpcTest, CancellingTheCallAbortsTheWorkers) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("p", tandem::v1::WORKER_ROLE_PREFILL, 20)), nullptr);
  FakeWorker* decode = env.AddWorker(Role("d", tandem::v1::WORKER_ROLE_DECODE, 20));
  ASSERT_NE(decode, nullptr);
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(env.grpc_address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  GenerateRequest request;
  request.set_prompt("x");
  request.mutable_sampling()->set_max_tokens(200);
  auto reader = stub->Generate(&context, request);
  GenerateResponse response;
  int read = 0;
  while (read < 3 && reader->Read(&response)) ++read;
  ASSERT_EQ(read, 3);
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode->streams_open() == 0; }, absl::Seconds(1)));
  EXPECT_TRUE(decode->aborts() > 0 || decode->cancelled_streams() > 0);
  EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().num_live() == 0; }));
}

TEST(RouterGrpcTest, ErrorsMapToGrpcCodes) {
  RouterConfig config = TestRouterConfig();
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok());
  GenerateRequest request;
  request.set_prompt("x");
  EXPECT_EQ(Generate(env.grpc_address(), request).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);  // no worker yet
  ASSERT_NE(env.AddWorker(Role("m", tandem::v1::WORKER_ROLE_MIXED)), nullptr);
  request.mutable_sampling()->set_temperature(3);
  GrpcResult bad = Generate(env.grpc_address(), request);
  EXPECT_EQ(bad.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(bad.status.error_message(), ::testing::HasSubstr("temperature"));
  request.clear_sampling();
  request.set_model("other");
  EXPECT_EQ(Generate(env.grpc_address(), request).status.error_code(), grpc::StatusCode::NOT_FOUND);
  request.clear_model();
  request.mutable_sampling()->set_max_tokens(1000);
  EXPECT_EQ(Generate(env.grpc_address(), request).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  GenerateRequest empty;
  EXPECT_EQ(Generate(env.grpc_address(), empty).status.error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace tandem::router::testing
