// The gRPC target against an in-process Generation service with scripted delays: the same
// exactness contract as exactness_test.cc. Lower bounds are exact (the script's delays, and
// causality against the service's own clock readings). Upper bounds allow kSlackMs, and they
// cover only what the loadgen and loopback add: the service records when it received each
// request and wrote each message, so a late wake-up of the service's own sleeps (which a busy
// 2-core machine can stretch by tens of milliseconds) is not charged to the loadgen.
#include "loadgen/grpc_target.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"
#include "loadgen/benchmark_runner.h"
#include "loadgen/metrics.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::loadgen {
namespace {

namespace v1 = tandem::v1;
constexpr double kSlackMs = 15.0;

// TTFT 30 ms, then one token every 10 ms; the terminal message carries usage and timings.
// Prompts starting with "bad" get INVALID_ARGUMENT; "fail" get a FINISH_REASON_ERROR message.
class ScriptedGeneration final : public v1::Generation::Service {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;  // BenchClock's clock
  struct Observed {
    TimePoint received;
    std::vector<TimePoint> token_writes;  // just before each token message is written
  };

  grpc::Status Generate(grpc::ServerContext*, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    auto t0 = std::chrono::steady_clock::now();
    if (request->prompt().rfind("bad", 0) == 0) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "scripted bad request");
    }
    Observed observed{t0, {}};
    int n = request->sampling().max_tokens();
    for (int k = 0; k < n; ++k) {
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(30 + 10 * k));
      v1::GenerateResponse r;
      r.add_token_ids(k);
      r.set_text(" t");
      observed.token_writes.push_back(std::chrono::steady_clock::now());
      writer->Write(r);
    }
    {
      std::lock_guard lock(mu_);
      observed_[request->prompt()] = std::move(observed);
    }
    v1::GenerateResponse last;
    last.set_finish_reason(v1::FINISH_REASON_LENGTH);
    if (request->prompt().rfind("fail", 0) == 0) {
      last.set_finish_reason(v1::FINISH_REASON_ERROR);
      last.set_error_message("scripted worker failure");
    }
    last.mutable_usage()->set_prompt_tokens(7);
    last.mutable_usage()->set_completion_tokens(n);
    last.mutable_timings()->set_queue_s(0.001);
    last.mutable_timings()->set_prefill_queue_s(0.002);
    last.mutable_timings()->set_prefill_s(0.02);
    writer->Write(last);
    return grpc::Status::OK;
  }
  grpc::Status ListModels(grpc::ServerContext*, const v1::ListModelsRequest*,
                          v1::ListModelsResponse* response) override {
    response->add_models()->set_id("scripted-model");
    return grpc::Status::OK;
  }

  std::map<std::string, Observed> observed() {
    std::lock_guard lock(mu_);
    return observed_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, Observed> observed_;  // by prompt
};

TEST(GrpcTargetTest, ScriptedStreamsAreMeasuredExactlyAndFailuresClassified) {
  ScriptedGeneration service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  std::string address = "127.0.0.1:" + std::to_string(port);
  auto model = FetchFirstGrpcModelId(address);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model, "scripted-model");

  boost::asio::io_context io;
  BenchClock clock;
  GrpcTargetOptions options;
  options.address = address;
  auto target = GrpcTarget::Create(io, &clock, options);
  ASSERT_TRUE(target.ok());
  std::vector<RequestSpec> specs(6);
  for (int i = 0; i < 6; ++i) {
    specs[i].prompt = i == 4   ? "bad prompt"
                      : i == 5 ? "fail prompt"
                               : "good prompt " + std::to_string(i);
    specs[i].output_len = 4;
  }
  BenchmarkRunner runner(io, &clock, target->get());
  RunResult result = runner.Run(specs, {0, 0.02, 0.04, 0.06, 0.08, 0.1}, RunOptions());
  server->Shutdown();
  ASSERT_EQ(result.records.size(), 6u);
  auto observed = service.observed();
  auto server_ms = [&](ScriptedGeneration::TimePoint t) {
    return std::chrono::duration<double, std::milli>(t - clock.At(0)).count();
  };
  double measured_itl_sum = 0, served_itl_sum = 0;
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    const RequestRecord& r = result.records[i];
    ASSERT_TRUE(r.success) << r.error;
    EXPECT_EQ(r.output_tokens, 4);
    EXPECT_EQ(r.prompt_len, 7);
    ASSERT_EQ(r.chunk_ns.size(), 4u);
    EXPECT_GE(r.TtftMs(), 30.0);
    EXPECT_GE(r.E2elMs(), 60.0);
    ASSERT_EQ(observed.count(specs[i].prompt), 1u);
    const ScriptedGeneration::Observed& o = observed[specs[i].prompt];
    ASSERT_EQ(o.token_writes.size(), 4u);
    // Causality: sent before the service saw it; every token seen after the service wrote it.
    double released_ms = r.released_ns / 1e6, received_ms = server_ms(o.received);
    EXPECT_LE(r.send_ns / 1e6, received_ms);
    for (int k = 0; k < 4; ++k) EXPECT_GE(r.chunk_ns[k] / 1e6, server_ms(o.token_writes[k]));
    // What the loadgen and loopback add on top of the service's own time: before the service
    // received the request, and after it wrote the first and the last token.
    double served_ttft = server_ms(o.token_writes.front()) - received_ms;
    double served_e2el = server_ms(o.token_writes.back()) - received_ms;
    EXPECT_LE(r.TtftMs() - served_ttft, kSlackMs)
        << "released " << released_ms << " ms, received " << received_ms << " ms";
    EXPECT_LE(r.E2elMs() - served_e2el, kSlackMs);
    measured_itl_sum += (r.chunk_ns.back() - r.chunk_ns.front()) / 1e6;
    served_itl_sum += server_ms(o.token_writes.back()) - server_ms(o.token_writes.front());
  }
  Metrics m = ComputeMetrics(result.records, result.duration_s, {99}, Slo());
  EXPECT_EQ(m.completed, 4);
  EXPECT_EQ(m.failed_by_cause["grpc_status"], 1);
  EXPECT_EQ(m.failed_by_cause["stream_error"], 1);
  // The reported mean ITL is the measured chunk gaps' mean (3 gaps per request), and it tracks
  // the gaps the service wrote (10 ms as scripted, less when a late first write catches up).
  EXPECT_NEAR(m.dists["itl"].mean, measured_itl_sum / 12, 1e-6);
  EXPECT_NEAR(measured_itl_sum / 12, served_itl_sum / 12, kSlackMs / 3);
  ASSERT_EQ(m.phase_requests, 4);
  EXPECT_NEAR(m.phases["queue"].mean, 3.0, 1e-9);
  EXPECT_NEAR(m.phases["prefill"].mean, 20.0, 1e-9);
}

}  // namespace
}  // namespace tandem::loadgen
