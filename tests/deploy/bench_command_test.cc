// `tandem bench` as a user runs it, on the tiny model and the CPU backend: every scenario
// reports, the JSON holds what the table printed, --random-range-ratio draws ragged lengths
// (vLLM's random dataset) and a bad value is refused.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "deploy/launcher/child_process.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

struct BenchRun {
  int exit_code = -1;
  std::string out;      // stdout and stderr
  nlohmann::json json;  // --json's file (null when absent)
};

// Runs `tandem bench` on the tiny model (CPU) with `flags`, the JSON written to a temp dir.
BenchRun RunBench(const std::vector<std::string>& flags) {
  char tmpl[] = "/tmp/tandem-bench-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<std::string> argv = {std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin/tandem",
                                   "bench",
                                   "--model",
                                   TinyModelDir(),
                                   "--backend",
                                   "cpu",
                                   "--json",
                                   dir + "/out.json"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  BenchRun run;
  auto child = launcher::ChildProcess::Start(argv, {}, dir + "/bench.out");
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return run;
  const std::optional<int> code = (*child)->Wait(absl::Seconds(60));
  EXPECT_TRUE(code.has_value()) << "tandem bench did not exit within 60 s";
  run.exit_code = code.value_or(-1);
  run.out = ReadFile(dir + "/bench.out");
  const std::string json = ReadFile(dir + "/out.json");
  if (!json.empty()) run.json = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  std::filesystem::remove_all(dir);
  return run;
}

const std::vector<std::string> kSmall = {
    "--latency-prompt", "8",  "--latency-tokens", "4",  "--batch-sizes",  "1,3",
    "--contexts",       "16", "--decode-tokens",  "4",  "--prefill-lens", "32",
    "--num-prompts",    "6",  "--input-len",      "12", "--output-len",   "5"};

TEST(BenchCommand, EveryScenarioReportsInTheTableAndTheJson) {
  const BenchRun run = RunBench(kSmall);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  ASSERT_TRUE(run.json.is_object()) << run.out;
  EXPECT_EQ(run.json["backend"], "cpu");
  EXPECT_GT(run.json["latency"]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(run.json["latency"]["output_tokens"], 4);
  ASSERT_EQ(run.json["decode"].size(), 2u);  // --batch-sizes 1,3 at one context
  EXPECT_EQ(run.json["decode"][1]["batch"], 3);
  EXPECT_EQ(run.json["decode"][1]["context"], 16);
  EXPECT_GT(run.json["decode"][1]["tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(run.json["prefill"][0]["prompt_tokens"], 32);
  const nlohmann::json& t = run.json["throughput"];
  EXPECT_EQ(t["input_tokens"], 6 * 12);  // every request its full length (EOS ignored)
  EXPECT_EQ(t["output_tokens"], 6 * 5);
  EXPECT_EQ(t["random_range_ratio"], 0.0);
  EXPECT_GT(t["output_tokens_per_s"].get<double>(), 0);
  for (const char* row : {"latency  B=1", "decode   B=3 ctx 16", "prefill  32 tokens",
                          "throughput 6 x (12 in, 5 out)"}) {
    EXPECT_NE(run.out.find(row), std::string::npos) << "no row \"" << row << "\" in\n" << run.out;
  }
}

TEST(BenchCommand, RandomRangeRatioDrawsRaggedLengths) {
  std::vector<std::string> flags = {"--scenarios",          "throughput", "--num-prompts", "40",
                                    "--input-len",          "20",         "--output-len",  "10",
                                    "--random-range-ratio", "0.5"};
  const BenchRun run = RunBench(flags);
  ASSERT_EQ(run.exit_code, 0) << run.out;
  const nlohmann::json& t = run.json["throughput"];
  EXPECT_EQ(t["random_range_ratio"], 0.5);
  // 40 lengths uniform in [10, 30] and [5, 15]: their sums lie within the bounds and, drawn at
  // random, are not all the nominal length.
  const int in = t["input_tokens"], out = t["output_tokens"];
  EXPECT_GE(in, 40 * 10);
  EXPECT_LE(in, 40 * 30);
  EXPECT_GE(out, 40 * 5);
  EXPECT_LE(out, 40 * 15);
  EXPECT_FALSE(in == 40 * 20 && out == 40 * 10) << "lengths not drawn";
  EXPECT_NE(run.out.find("lengths +-50%"), std::string::npos) << run.out;
}

TEST(BenchCommand, RefusesARangeRatioOfOneOrMore) {
  const BenchRun run = RunBench({"--scenarios", "throughput", "--random-range-ratio", "1"});
  EXPECT_NE(run.exit_code, 0);
  EXPECT_NE(run.out.find("random-range-ratio"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace tandem::e2e
