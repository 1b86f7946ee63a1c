// End to end on loopback with real processes: layouts whose groups have tensor_parallel 2 (each
// worker one engine of TP x PP rank threads, CPU backend). A mixed layout of TP = 2, a 1P1D
// layout of TP = 2 on both groups and one of TP = 2 x PP = 2 on both (the KV pages of every rank
// pushed from prefill to decode) give the greedy tokens of the TP = 1 mixed layout (itself equal
// to the single-engine reference) for prompts around page boundaries. Each worker is checked to
// have been given the sizes as flags, to have loaded its model with them, and to have served.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"
#include "tests/deploy/layout_equality.h"

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

const GreedyPrompts kPrompts = {.lengths = {1, 15, 16, 17, 60}, .max_tokens = 16, .seed_base = 700};

// Every worker was started with --tensor-parallel-size `tp` and (tp > 1) loaded its model so.
void ExpectWorkersRanWith(launcher::Cluster& cluster, const std::string& log_dir, int tp, int pp) {
  const std::vector<launcher::Process*> workers = cluster.workers();
  ASSERT_FALSE(workers.empty());
  for (const launcher::Process* w : workers) {
    EXPECT_EQ(WorkerFlag(*w, "--tensor-parallel-size"), std::to_string(tp)) << w->name;
    EXPECT_EQ(WorkerFlag(*w, "--pipeline-parallel-size"), std::to_string(pp)) << w->name;
    // Every worker took part (in 1P1D the decode worker received the prompts' KV).
    EXPECT_GT(GetLoad(cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
    if (tp == 1 && pp == 1) continue;  // the plain model's load line names no sizes
    const std::string log = WorkerLog(log_dir, *w);
    EXPECT_NE(log.find(absl::StrCat("tensor_parallel ", tp, " x pipeline_parallel ", pp)),
              std::string::npos)
        << w->name << " log:\n"
        << log;
  }
}

LayoutRun RanWith(const char* yaml, int tp, int pp) {
  return {yaml, [tp, pp](launcher::Cluster& cluster, const std::string& log_dir) {
            ExpectWorkersRanWith(cluster, log_dir, tp, pp);
          }};
}

TEST(ParallelE2E, TensorParallelLayoutsMatchTheTp1MixedLayout) {
  TokensByLength want;  // set once the baseline served every prompt in full
  ExpectLayoutsMatchBaseline(
      RanWith(kMixedTp1, 1, 1),
      {RanWith(kMixedTp2, 2, 1), RanWith(k1P1DTp2, 2, 1), RanWith(k1P1DTp2Pp2, 2, 2)}, kPrompts,
      /*model_dir=*/"", &want);
  ASSERT_FALSE(want.empty()) << "the baseline did not serve";
  // The baseline is itself the single-engine reference.
  for (int n : kPrompts.lengths) {
    GenerateArgs args;
    args.prompt = kPrompts.PromptOf(n);
    args.max_tokens = kPrompts.max_tokens;
    EXPECT_EQ(want[n], ReferenceGreedy(TinyModelDir(), args)) << "prompt length " << n;
  }
}

}  // namespace
}  // namespace tandem::e2e
