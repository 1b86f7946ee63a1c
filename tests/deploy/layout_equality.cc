#include "tests/deploy/layout_equality.h"

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

// Starts `yaml` with `model_dir` (empty: the harness's tiny model); `log_dir` gets its log
// folder.
std::unique_ptr<launcher::Cluster> Start(const std::string& yaml, const std::string& model_dir,
                                         std::string* log_dir) {
  return StartCluster(yaml, [&](launcher::Layout&, launcher::ClusterOptions& options) {
    if (!model_dir.empty()) options.model_dir = model_dir;
    *log_dir = options.log_dir;
  });
}

// Starts `run`, serves `prompts`, runs its checks and shuts it down; fatal if it does not start.
void ServeRun(const LayoutRun& run, const GreedyPrompts& prompts, const std::string& model_dir,
              TokensByLength* tokens) {
  std::string log_dir;
  std::unique_ptr<launcher::Cluster> cluster = Start(run.yaml, model_dir, &log_dir);
  ASSERT_NE(cluster, nullptr);
  *tokens = ServeGreedy(*cluster, prompts);
  if (run.expect) run.expect(*cluster, log_dir);
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

}  // namespace

std::vector<int32_t> GreedyPrompts::PromptOf(int n) const {
  return Prompt(n, seed_base + static_cast<uint32_t>(n));
}

TokensByLength ServeGreedy(launcher::Cluster& cluster, const GreedyPrompts& prompts) {
  TokensByLength out;
  for (int n : prompts.lengths) {
    GenerateArgs args;
    args.prompt = prompts.PromptOf(n);
    args.max_tokens = prompts.max_tokens;
    StreamResult got = Generate(cluster.router().grpc_address, args);
    EXPECT_TRUE(got.status.ok()) << "prompt length " << n << ": " << got.status.error_message();
    EXPECT_EQ(got.finish, tandem::v1::FINISH_REASON_LENGTH) << "prompt length " << n;
    out[n] = got.tokens;
  }
  std::string why;
  EXPECT_TRUE(WaitForIdle(cluster, absl::Seconds(2), &why)) << why;
  return out;
}

void ExpectLayoutsMatchBaseline(const LayoutRun& baseline, const std::vector<LayoutRun>& layouts,
                                const GreedyPrompts& prompts, const std::string& model_dir,
                                TokensByLength* baseline_tokens) {
  TokensByLength want;
  {
    SCOPED_TRACE("baseline");
    ASSERT_NO_FATAL_FAILURE(ServeRun(baseline, prompts, model_dir, &want));
  }
  for (int n : prompts.lengths) {
    ASSERT_EQ(want[n].size(), static_cast<size_t>(prompts.max_tokens)) << "prompt length " << n;
  }
  if (baseline_tokens != nullptr) *baseline_tokens = want;
  for (const LayoutRun& run : layouts) {
    SCOPED_TRACE(run.yaml);
    TokensByLength got;
    ASSERT_NO_FATAL_FAILURE(ServeRun(run, prompts, model_dir, &got));
    for (int n : prompts.lengths) EXPECT_EQ(got.at(n), want[n]) << "prompt length " << n;
  }
}

std::string WorkerFlag(const launcher::Process& worker, const std::string& flag) {
  for (size_t i = 0; i + 1 < worker.argv.size(); ++i) {
    if (worker.argv[i] == flag) return worker.argv[i + 1];
  }
  return "";
}

std::string WorkerLog(const std::string& log_dir, const launcher::Process& worker) {
  std::ifstream in(absl::StrCat(log_dir, "/", worker.name, ".log"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace tandem::e2e
