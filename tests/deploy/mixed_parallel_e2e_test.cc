// End to end on loopback with real processes: prefill and decode groups of different
// tensor_parallel (and pipeline_parallel) sizes, the prompts' KV pushed over the TCP transport
// and landed through the KV head map (comm/kv_head_map.h). For every tiny preset that splits at
// TP 2 (every architecture; GQA, MHA, one KV head replicated at TP 2, fp32 pages), 2 prefill
// workers of TP 2 with a decode worker of TP 1, and 1 prefill worker of TP 1 with a decode
// worker of TP 2, give the greedy tokens of the colocated (mixed, TP 1) layout, prompt by
// prompt, for prompts of one token, a partial page, exactly one page, one page and a token, and
// several pages. One preset also runs prefill TP 2 x PP 2 into decode TP 1 x PP 3 and TP 1 x
// PP 3 into TP 2 x PP 2 (uneven layer splits). Each decode worker must have received the
// prompts' KV (its prompt-token counter) and logged that the pages went through the map.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/model/presets.h"
#include "engine/model/tensor_shard.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"
#include "tests/deploy/layout_equality.h"

namespace tandem::e2e {
namespace {

constexpr char kMixedTp1[] = R"(
backend: cpu
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: mixed, count: 1}
)";

constexpr char k2PTp2To1DTp1[] = R"(
backend: cpu
kv_transport: tcp
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 2, tensor_parallel: 2}
  - {role: decode, count: 1, tensor_parallel: 1}
)";

constexpr char k1PTp1To1DTp2[] = R"(
backend: cpu
kv_transport: tcp
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 1, tensor_parallel: 1}
  - {role: decode, count: 1, tensor_parallel: 2}
)";

constexpr char kPTp2Pp2ToDPp3[] = R"(
backend: cpu
kv_transport: auto
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 1, tensor_parallel: 2, pipeline_parallel: 2}
  - {role: decode, count: 1, tensor_parallel: 1, pipeline_parallel: 3}
)";

constexpr char kPTp1Pp3ToDTp2Pp2[] = R"(
backend: cpu
kv_transport: tcp
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 1, tensor_parallel: 1, pipeline_parallel: 3}
  - {role: decode, count: 1, tensor_parallel: 2, pipeline_parallel: 2}
)";

const GreedyPrompts kPrompts = {.lengths = {1, 9, 16, 17, 45}, .max_tokens = 12, .seed_base = 900};

struct Sizes {
  int tp, pp;
};

struct Case {
  const char* yaml;
  Sizes prefill, decode;
};

// Every worker ran with its group's sizes; every decode worker took part and mapped the pages.
void ExpectWorkers(launcher::Cluster& cluster, const std::string& log_dir, Sizes prefill,
                   Sizes decode) {
  int decoders = 0;
  for (const launcher::Process* w : cluster.workers()) {
    const Sizes want = w->role == "prefill" ? prefill : decode;
    EXPECT_EQ(WorkerFlag(*w, "--tensor-parallel-size"), std::to_string(want.tp)) << w->name;
    EXPECT_EQ(WorkerFlag(*w, "--pipeline-parallel-size"), std::to_string(want.pp)) << w->name;
    if (w->role != "decode") continue;
    ++decoders;
    EXPECT_GT(GetLoad(cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
    const std::string log = WorkerLog(log_dir, *w);
    EXPECT_NE(log.find("land through the KV head map"), std::string::npos) << w->name << " log:\n"
                                                                           << log;
  }
  EXPECT_EQ(decoders, 1);
}

// The mixed TP 1 layout's tokens on `preset`, then each case's, which must equal them.
void RunPreset(const std::string& preset, const std::vector<Case>& cases) {
  SCOPED_TRACE(preset);
  std::vector<LayoutRun> layouts;
  for (const Case& c : cases) {
    layouts.push_back({c.yaml, [c](launcher::Cluster& cluster, const std::string& log_dir) {
                         ExpectWorkers(cluster, log_dir, c.prefill, c.decode);
                       }});
  }
  ExpectLayoutsMatchBaseline({kMixedTp1, nullptr}, layouts, kPrompts, PresetModelDir(preset));
}

const std::vector<Case> kTpCases = {{k2PTp2To1DTp1, {2, 1}, {1, 1}},
                                    {k1PTp1To1DTp2, {1, 1}, {2, 1}}};

// Llama, GQA 4:2 (each TP 2 rank one KV head).
TEST(MixedParallelE2E, Llama3) { RunPreset("tiny-llama3", kTpCases); }
// One KV head: both TP 2 ranks hold a copy; TP 2 -> 1 takes rank 0's, 1 -> 2 fills both.
TEST(MixedParallelE2E, Llama31OneKvHeadReplicated) { RunPreset("tiny-llama31", kTpCases); }
TEST(MixedParallelE2E, Mistral) { RunPreset("tiny-mistral", kTpCases); }
// fp32 weights and pages; 3 layers: PP 2 and 3 split them unevenly.
TEST(MixedParallelE2E, Qwen2Fp32AndPipelineStages) {
  std::vector<Case> cases = kTpCases;
  cases.push_back({kPTp2Pp2ToDPp3, {2, 2}, {1, 3}});
  cases.push_back({kPTp1Pp3ToDTp2Pp2, {1, 3}, {2, 2}});
  RunPreset("tiny-qwen2", cases);
}
// QK-norm, head_dim 32 != hidden / heads.
TEST(MixedParallelE2E, Qwen3) { RunPreset("tiny-qwen3", kTpCases); }
// Every other tiny preset whose shapes split at TP 2 (tied embeddings, MHA, f16 weights, ...).
TEST(MixedParallelE2E, EveryOtherTinyPresetThatSplits) {
  const std::vector<std::string> named = {"tiny",         "tiny-llama3", "tiny-llama31",
                                          "tiny-mistral", "tiny-qwen2",  "tiny-qwen3"};
  int ran = 0;
  for (const ModelPreset& p : ModelPresets()) {
    if (!p.tiny || std::find(named.begin(), named.end(), p.name) != named.end()) continue;
    if (!CheckTensorParallel(p.config, 2).ok()) continue;  // e.g. 3 KV heads
    RunPreset(p.name, kTpCases);
    ++ran;
  }
  EXPECT_GE(ran, 3);
}

}  // namespace
}  // namespace tandem::e2e
