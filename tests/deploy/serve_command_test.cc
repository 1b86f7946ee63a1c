// `tandem serve` as a user runs it: with no layout and no model it generates the tiny model,
// brings up 1 prefill + 1 decode worker, prints where to point a client, serves; SIGTERM drains
// the request in flight (it completes) and stops every process with exit code 0. A layout of
// tensor_parallel > 1 on cuda is refused before anything starts.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "deploy/launcher/child_process.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ServeCommand, DefaultLayoutServesAndDrainsOnSigterm) {
  char tmpl[] = "/tmp/tandem-serve-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string bin = std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin";
  auto serve =
      launcher::ChildProcess::Start({bin + "/tandem", "serve", "--port", "0", "--log-dir",
                                     dir + "/logs", "--drain-timeout-s", "10"},
                                    {{"TANDEM_CACHE_DIR", dir + "/cache"}}, dir + "/serve.out");
  ASSERT_TRUE(serve.ok()) << serve.status();
  // Ready line and the addresses it prints.
  std::smatch http, grpc_addr;
  std::string out;
  const absl::Time deadline = absl::Now() + absl::Seconds(90);
  const std::regex ready_re("ready at http://([0-9.]+:[0-9]+)");
  const std::regex grpc_re("gRPC API +([0-9.]+:[0-9]+)");
  while (absl::Now() < deadline && (*serve)->Running()) {
    out = ReadFile(dir + "/serve.out");
    if (std::regex_search(out, http, ready_re) && std::regex_search(out, grpc_addr, grpc_re)) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(!http.empty() && !grpc_addr.empty()) << out;
  EXPECT_NE(out.find("/metrics"), std::string::npos) << out;
  EXPECT_TRUE(std::filesystem::exists(dir + "/cache/models/tiny/config.json"));
  auto models = launcher::HttpGet(http[1], "/v1/models", absl::Seconds(5));
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(models->status, 200);
  EXPECT_NE(models->body.find("tiny"), std::string::npos) << models->body;
  // Same text as `tandem generate` (one engine, no RPC) for the same prompt, greedy.
  auto completion = launcher::HttpPostJson(
      http[1], "/v1/completions",
      R"({"model": "tiny", "prompt": "Hello world", "max_tokens": 12, "temperature": 0,
          "ignore_eos": true})",
      absl::Seconds(30));
  ASSERT_TRUE(completion.ok()) << completion.status();
  ASSERT_EQ(completion->status, 200) << completion->body;
  const nlohmann::json body = nlohmann::json::parse(completion->body, nullptr, false);
  ASSERT_FALSE(body.is_discarded()) << completion->body;
  auto generate = launcher::ChildProcess::Start(
      {bin + "/tandem", "generate", "--model", dir + "/cache/models/tiny", "--prompt",
       "Hello world", "--max-tokens", "12", "--temperature", "0", "--ignore-eos"},
      {}, dir + "/generate.out");
  ASSERT_TRUE(generate.ok());
  ASSERT_EQ((*generate)->Wait(absl::Seconds(30)), std::optional<int>(0));
  const std::string generated = ReadFile(dir + "/generate.out");
  const std::string text = body["choices"][0]["text"].get<std::string>();
  EXPECT_FALSE(text.empty());
  EXPECT_NE(generated.find(text), std::string::npos)
      << "served: '" << text << "' generate: '" << generated << "'";
  // Worker pids printed by serve: they must all be gone after the stop.
  std::vector<int> pids;
  const std::regex pid_re("pid ([0-9]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), pid_re), end; it != end; ++it) {
    pids.push_back(std::stoi((*it)[1]));
  }
  EXPECT_EQ(pids.size(), 2u) << out;
  // A request in flight when SIGTERM arrives still completes.
  StreamResult in_flight;
  std::thread client([&] {
    GenerateArgs args;
    args.prompt = Prompt(30, 1);
    args.max_tokens = 200;
    in_flight = Generate(grpc_addr[1], args);
  });
  absl::SleepFor(absl::Milliseconds(150));
  (*serve)->Signal(SIGTERM);
  client.join();
  EXPECT_TRUE(in_flight.status.ok()) << in_flight.status.error_message();
  EXPECT_EQ(in_flight.tokens.size(), 200u);
  const std::optional<int> code = (*serve)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << ReadFile(dir + "/serve.out");
  for (int pid : pids) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still running";
}

// A layout of tensor_parallel > 1 on the cuda backend stops `tandem serve` before it starts
// anything, saying why (exit code 2, as for any bad layout).
TEST(ServeCommand, TensorParallelLayoutOnCudaIsRefused) {
  char tmpl[] = "/tmp/tandem-serve-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string bin = std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin";
  {
    std::ofstream layout(dir + "/tp2-cuda.yaml");
    layout << "backend: cuda\ngroups:\n  - {role: mixed, tensor_parallel: 2}\n";
  }
  auto serve =
      launcher::ChildProcess::Start({bin + "/tandem", "serve", "--layout", dir + "/tp2-cuda.yaml",
                                     "--port", "0", "--log-dir", dir + "/logs"},
                                    {{"TANDEM_CACHE_DIR", dir + "/cache"}}, dir + "/serve.out");
  ASSERT_TRUE(serve.ok()) << serve.status();
  EXPECT_EQ((*serve)->Wait(absl::Seconds(30)), std::optional<int>(2));
  const std::string out = ReadFile(dir + "/serve.out");
  EXPECT_NE(out.find("run on the CPU backend only so far"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir + "/logs/router.log")) << "something was started";
}

}  // namespace
}  // namespace tandem::e2e
