// End to end on loopback with real processes: layouts whose groups have tensor_parallel 2 (each
// worker one engine of TP x PP rank threads, CPU backend). A mixed layout of TP = 2, a 1P1D
// layout of TP = 2 on both groups and one of TP = 2 x PP = 2 on both (the KV pages of every rank
// pushed from prefill to decode) give the greedy tokens of the TP = 1 mixed layout (itself equal
// to the single-engine reference) for prompts around page boundaries. Each worker is checked to
// have been given the sizes as flags, to have loaded its model with them, and to have served.
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

constexpr char kMixedTp1[] = R"(
backend: cpu
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: mixed, count: 1}
)";

constexpr char kMixedTp2[] = R"(
backend: cpu
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: mixed, count: 1, tensor_parallel: 2}
)";

constexpr char k1P1DTp2[] = R"(
backend: cpu
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1, tensor_parallel: 2}
  - {role: decode, count: 1, tensor_parallel: 2}
)";

constexpr char k1P1DTp2Pp2[] = R"(
backend: cpu
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1, tensor_parallel: 2, pipeline_parallel: 2}
  - {role: decode, count: 1, tensor_parallel: 2, pipeline_parallel: 2}
)";

constexpr int kMaxTokens = 16;
const int kPromptLengths[] = {1, 15, 16, 17, 60};

std::vector<int32_t> PromptOf(int n) { return Prompt(n, 700u + static_cast<uint32_t>(n)); }

// Greedy tokens of every prompt of kPromptLengths through the cluster's router.
std::map<int, std::vector<int32_t>> Serve(launcher::Cluster& cluster) {
  std::map<int, std::vector<int32_t>> out;
  for (int n : kPromptLengths) {
    GenerateArgs args;
    args.prompt = PromptOf(n);
    args.max_tokens = kMaxTokens;
    StreamResult got = Generate(cluster.router().grpc_address, args);
    EXPECT_TRUE(got.status.ok()) << "prompt length " << n << ": " << got.status.error_message();
    EXPECT_EQ(got.finish, tandem::v1::FINISH_REASON_LENGTH) << "prompt length " << n;
    out[n] = got.tokens;
  }
  std::string why;
  EXPECT_TRUE(WaitForIdle(cluster, absl::Seconds(2), &why)) << why;
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every worker was started with --tensor-parallel-size `tp` and (tp > 1) loaded its model so.
void ExpectWorkersRanWith(launcher::Cluster& cluster, const std::string& log_dir, int tp, int pp) {
  const std::vector<launcher::Process*> workers = cluster.workers();
  ASSERT_FALSE(workers.empty());
  for (const launcher::Process* w : workers) {
    std::string tp_flag, pp_flag;
    for (size_t i = 0; i + 1 < w->argv.size(); ++i) {
      if (w->argv[i] == "--tensor-parallel-size") tp_flag = w->argv[i + 1];
      if (w->argv[i] == "--pipeline-parallel-size") pp_flag = w->argv[i + 1];
    }
    EXPECT_EQ(tp_flag, std::to_string(tp)) << w->name;
    EXPECT_EQ(pp_flag, std::to_string(pp)) << w->name;
    // Every worker took part (in 1P1D the decode worker received the prompts' KV).
    EXPECT_GT(GetLoad(cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
    if (tp == 1 && pp == 1) continue;  // the plain model's load line names no sizes
    const std::string log = ReadFile(absl::StrCat(log_dir, "/", w->name, ".log"));
    EXPECT_NE(log.find(absl::StrCat("tensor_parallel ", tp, " x pipeline_parallel ", pp)),
              std::string::npos)
        << w->name << " log:\n"
        << log;
  }
}

std::unique_ptr<launcher::Cluster> Start(const char* yaml, std::string* log_dir) {
  return StartCluster(yaml, [log_dir](launcher::Layout&, launcher::ClusterOptions& options) {
    *log_dir = options.log_dir;
  });
}

TEST(ParallelE2E, TensorParallelLayoutsMatchTheTp1MixedLayout) {
  std::string log_dir;
  std::map<int, std::vector<int32_t>> want;
  {
    std::unique_ptr<launcher::Cluster> cluster = Start(kMixedTp1, &log_dir);
    ASSERT_NE(cluster, nullptr);
    want = Serve(*cluster);
    ExpectWorkersRanWith(*cluster, log_dir, 1, 1);
    EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
  }
  for (int n : kPromptLengths) {
    ASSERT_EQ(want[n].size(), size_t{kMaxTokens}) << n;
    // The baseline is itself the single-engine reference.
    GenerateArgs args;
    args.prompt = PromptOf(n);
    args.max_tokens = kMaxTokens;
    EXPECT_EQ(want[n], ReferenceGreedy(TinyModelDir(), args)) << "prompt length " << n;
  }
  struct Case {
    const char* yaml;
    int tp, pp;
  };
  for (const Case& c : {Case{kMixedTp2, 2, 1}, Case{k1P1DTp2, 2, 1}, Case{k1P1DTp2Pp2, 2, 2}}) {
    SCOPED_TRACE(c.yaml);
    std::unique_ptr<launcher::Cluster> cluster = Start(c.yaml, &log_dir);
    ASSERT_NE(cluster, nullptr);
    const std::map<int, std::vector<int32_t>> got = Serve(*cluster);
    ExpectWorkersRanWith(*cluster, log_dir, c.tp, c.pp);
    for (int n : kPromptLengths) {
      EXPECT_EQ(got.at(n), want[n]) << "prompt length " << n;
    }
    EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
  }
}

// A layout of PP > 1 on an unresolved or cuda backend never starts a process (TP alone runs on
// cuda: engine_cuda_tp_test).
TEST(ParallelE2E, PipelineParallelOffTheCpuBackendIsRefusedBeforeStarting) {
  for (const char* backend : {"auto", "cuda"}) {
    absl::StatusOr<std::unique_ptr<launcher::Cluster>> c =
        TryStartCluster(kMixedTp2, [backend](launcher::Layout& l, launcher::ClusterOptions&) {
          l.backend = backend;
          for (launcher::GroupSpec& g : l.groups) g.pipeline_parallel = 2;
        });
    ASSERT_FALSE(c.ok()) << backend;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
    EXPECT_NE(c.status().message().find("CPU backend only"), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace tandem::e2e
