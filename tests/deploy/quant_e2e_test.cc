// End to end on loopback with real processes: a layout's engine.quantization reaches every worker
// as --quantization, each worker loads its weights quantized (its load line says so), and the
// cluster serves the greedy tokens of a single engine quantized the same way, for a mixed layout
// (int8) and a 1P1D layout (int4: the prefill and decode workers quantize alike, so the pushed KV
// pages are the decode worker's own). CPU backend, the tiny model; on the CUDA backend the same
// flag runs the quantized GEMMs of engine/cuda (engine_cuda_test).
#include <iostream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

constexpr int kMaxTokens = 12;
const int kPromptLengths[] = {1, 16, 17, 45};

void ServeQuantized(const std::string& yaml, const std::string& quantization,
                    const std::string& load_line) {
  SCOPED_TRACE(yaml);
  std::string log_dir;
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(
      yaml,
      [&](launcher::Layout&, launcher::ClusterOptions& options) { log_dir = options.log_dir; });
  ASSERT_NE(cluster, nullptr);
  int differs_from_bf16 = 0;
  for (int n : kPromptLengths) {
    GenerateArgs args;
    args.prompt = Prompt(n, 900u + static_cast<uint32_t>(n));
    args.max_tokens = kMaxTokens;
    StreamResult got = Generate(cluster->router().grpc_address, args);
    ASSERT_TRUE(got.status.ok()) << "prompt length " << n << ": " << got.status.error_message();
    EXPECT_EQ(got.tokens, ReferenceGreedy(TinyModelDir(), args, quantization))
        << "prompt length " << n;
    differs_from_bf16 += got.tokens != ReferenceGreedy(TinyModelDir(), args);
  }
  // Informational: on random weights the quantized greedy tokens may or may not differ.
  std::cout << quantization << ": " << differs_from_bf16 << " of " << std::size(kPromptLengths)
            << " continuations differ from the unquantized model's\n";
  std::string why;
  EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(2), &why)) << why;
  for (const launcher::Process* w : cluster->workers()) {
    std::string flag;
    for (size_t i = 0; i + 1 < w->argv.size(); ++i) {
      if (w->argv[i] == "--quantization") flag = w->argv[i + 1];
    }
    EXPECT_EQ(flag, quantization) << w->name;
    EXPECT_GT(GetLoad(*cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
    const std::string log = ReadFile(absl::StrCat(log_dir, "/", w->name, ".log"));
    EXPECT_NE(log.find(load_line), std::string::npos) << w->name << " log:\n" << log;
  }
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST(QuantE2E, LayoutQuantizationReachesEveryWorker) {
  ServeQuantized(R"(
backend: cpu
engine: {page_size: 16, num_pages: 512, quantization: int8}
groups:
  - {role: mixed, count: 1}
)",
                 "int8", "weights int8 (quantized at load)");
  ServeQuantized(R"(
backend: cpu
engine: {page_size: 16, num_pages: 512, quantization: int4}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)",
                 "int4", "weights int4 (quantized at load)");
}

}  // namespace
}  // namespace tandem::e2e
