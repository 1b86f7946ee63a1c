// Client errors that used to become 5xx or leak internals (issue [hardening], findings 7 and 8),
// over HTTP and gRPC against fake workers: worker calls over gRPC's message limit, max_tokens
// near 2^63, roles gRPC accepted and HTTP did not, the API key over both front ends, and
// /health while large bodies are parsed.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "router/api_key.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::WORKER_ROLE_MIXED;
using ::testing::HasSubstr;

TEST(ClientErrorsTest, WorkerCallOverTheGrpcLimitIs400NotA503) {
  RouterConfig config = TestRouterConfig();
  config.max_body_bytes = size_t{16} << 20;
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  // 2.5M stop token ids of 2 varint bytes each: a 10 MB body, under --max-body-bytes, whose
  // worker call (5 MB) is over gRPC's 4 MiB (the fake worker keeps gRPC's default limit; before
  // the check, this was a 503 from the failed call).
  std::string ids;
  for (int i = 0; i < 2500000; ++i) absl::StrAppend(&ids, i == 0 ? "" : ",", 200);
  HttpResult r =
      Post(env.http_port(), "/v1/completions",
           absl::StrCat(R"({"prompt": "hi", "max_tokens": 2, "stop_token_ids": [)", ids, "]}"));
  EXPECT_EQ(r.status, 400) << r.body.substr(0, 300);
  EXPECT_THAT(r.body, HasSubstr("too large to pass to a worker"));
  EXPECT_EQ(r.Json()["error"]["code"], 400);
  // The server is fine afterwards.
  EXPECT_EQ(Post(env.http_port(), "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status,
            200);
}

TEST(ClientErrorsTest, MaxTokensNear2To63IsAContextError) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  for (const char* max_tokens : {"9223372036854775807", "9223372036854775806",
                                 "9223372036854775000", "4611686018427387904"}) {
    SCOPED_TRACE(max_tokens);
    HttpResult r = Post(env.http_port(), "/v1/completions",
                        absl::StrCat(R"({"prompt": "hi", "max_tokens": )", max_tokens, "}"));
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(r.body, HasSubstr("maximum context length is 256"));
    HttpResult chat = Post(env.http_port(), "/v1/chat/completions",
                           absl::StrCat(R"({"messages": [{"role": "user", "content": "x"}],
                                            "max_completion_tokens": )",
                                        max_tokens, "}"));
    EXPECT_EQ(chat.status, 400) << chat.body;
  }
}

grpc::Status GrpcGenerate(const std::string& address, const tandem::v1::GenerateRequest& request,
                          const std::string& authorization = "") {
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  if (!authorization.empty()) context.AddMetadata("authorization", authorization);
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = stub->Generate(&context, request);
  tandem::v1::GenerateResponse response;
  while (reader->Read(&response)) {
  }
  return reader->Finish();
}

TEST(ClientErrorsTest, GrpcAppliesTheHttpChecksToMessages) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  for (const char* role : {"tool", "function", "", "User", "root"}) {
    SCOPED_TRACE(role);
    tandem::v1::GenerateRequest request;
    auto* m = request.mutable_messages()->add_messages();
    m->set_role(role);
    m->set_content("hi");
    request.mutable_sampling()->set_max_tokens(2);
    grpc::Status status = GrpcGenerate(env.grpc_address(), request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("unsupported role"));
    // And HTTP says the same.
    HttpResult http = Post(env.http_port(), "/v1/chat/completions",
                           absl::StrCat(R"({"messages": [{"role": ")", role,
                                        R"(", "content": "hi"}], "max_tokens": 2})"));
    EXPECT_EQ(http.status, 400);
    EXPECT_THAT(http.body, HasSubstr("unsupported role"));
  }
  tandem::v1::GenerateRequest good;
  auto* m = good.mutable_messages()->add_messages();
  m->set_role("developer");
  m->set_content("hi");
  good.mutable_sampling()->set_max_tokens(2);
  EXPECT_TRUE(GrpcGenerate(env.grpc_address(), good).ok());
  tandem::v1::GenerateRequest huge_tokens;
  huge_tokens.set_prompt("hi");
  huge_tokens.mutable_sampling()->set_max_tokens(INT32_MAX);
  EXPECT_EQ(GrpcGenerate(env.grpc_address(), huge_tokens).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(ApiKeyTest, BearerIsCaseInsensitiveAndTheKeyExact) {
  EXPECT_TRUE(ApiKeyMatches("Bearer sk-1", "sk-1"));
  EXPECT_TRUE(ApiKeyMatches("bearer sk-1", "sk-1"));
  EXPECT_TRUE(ApiKeyMatches("BEARER   sk-1  ", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-12", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Bearer sk-1sk-1", "sk-1"));  // a repeat of the key
  EXPECT_FALSE(ApiKeyMatches("Bearer ", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Bearersk-1", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Basic sk-1", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("sk-1", "sk-1"));
  EXPECT_FALSE(ApiKeyMatches("Bearer x", ""));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("a", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  EXPECT_FALSE(ConstantTimeEquals("aa", "a"));
}

TEST(ApiKeyTest, BothFrontEndsCheckTheKeyListModelsToo) {
  RouterConfig config = TestRouterConfig();
  config.api_key = "sk-test";
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  EXPECT_EQ(
      Post(env.http_port(), "/v1/completions", body, "Authorization: bearer sk-test\r\n").status,
      200);
  for (const char* header :
       {"Authorization: Bearer sk-tes\r\n", "Authorization: Bearer sk-testx\r\n",
        "Authorization: sk-test\r\n", ""}) {
    HttpResult r = Post(env.http_port(), "/v1/completions", body, header);
    EXPECT_EQ(r.status, 401) << header;
    EXPECT_EQ(r.Json()["error"]["code"], 401);
  }
  auto stub = tandem::v1::Generation::NewStub(
      grpc::CreateChannel(env.grpc_address(), grpc::InsecureChannelCredentials()));
  for (const std::string auth : {"", "Bearer wrong", "bearer sk-test"}) {
    grpc::ClientContext context;
    if (!auth.empty()) context.AddMetadata("authorization", auth);
    tandem::v1::ListModelsRequest request;
    tandem::v1::ListModelsResponse response;
    grpc::Status status = stub->ListModels(&context, request, &response);
    if (auth == "bearer sk-test") {
      EXPECT_TRUE(status.ok()) << status.error_message();
      EXPECT_EQ(response.models_size(), 1);
    } else {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << auth;
      EXPECT_EQ(response.models_size(), 0);
    }
  }
  tandem::v1::GenerateRequest request;
  request.set_prompt("hi");
  request.mutable_sampling()->set_max_tokens(2);
  EXPECT_EQ(GrpcGenerate(env.grpc_address(), request, "Bearer sk-tes").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(GrpcGenerate(env.grpc_address(), request, "BEARER sk-test").ok());
}

TEST(LargeBodiesTest, HealthStaysFastWhileFourClientsPostEightMegabyteBodies) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  // ~8 MB of JSON that takes real parsing (many small values), rejected after the parse.
  std::string body = R"({"prompt": "hi", "max_tokens": 2, "extra": [)";
  while (body.size() < (size_t{8} << 20) - 64) body += "[1.5,\"ab\",{\"k\":null}],";
  body += "0]}";
  std::atomic<int> posted{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < 2; ++i) {
        HttpResult r = Post(env.http_port(), "/v1/completions", body);
        if (r.status != 0) ++posted;
      }
    });
  }
  HttpConnection probe;
  ASSERT_TRUE(probe.Connect(env.http_port()));
  absl::Duration worst;
  int probes = 0;
  while (posted.load() < 8 && probes < 2000) {
    const absl::Time start = absl::Now();
    ASSERT_TRUE(probe.Send(KeepAliveRequest("GET", "/health")));
    std::optional<HttpResult> r = probe.Read();
    ASSERT_TRUE(r.has_value() && r->status == 200);
    worst = std::max(worst, absl::Now() - start);
    ++probes;
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(posted.load(), 8);
  EXPECT_GT(probes, 5);
  // Parsed on the I/O threads, the bodies held /health for 300+ ms ([hardening] finding 8);
  // handler threads leave the I/O threads only the copying (44-76 ms worst seen here on a
  // loaded 2-core machine; the bound leaves room for CI's).
  EXPECT_LT(worst, absl::Milliseconds(150)) << "over " << probes << " probes";
  std::cout << "worst /health latency during the posts: " << worst << " over " << probes
            << " probes\n";
}

}  // namespace
}  // namespace tandem::router::testing
