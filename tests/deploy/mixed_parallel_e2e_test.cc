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
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/presets.h"
#include "engine/model/tensor_shard.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

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

constexpr int kMaxTokens = 12;
const int kPromptLengths[] = {1, 9, 16, 17, 45};

std::vector<int32_t> PromptOf(int n) { return Prompt(n, 900u + static_cast<uint32_t>(n)); }

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

std::string Flag(const launcher::Process& w, const std::string& flag) {
  for (size_t i = 0; i + 1 < w.argv.size(); ++i) {
    if (w.argv[i] == flag) return w.argv[i + 1];
  }
  return "";
}

struct Sizes {
  int tp, pp;
};

// Every worker ran with its group's sizes; every decode worker took part and mapped the pages.
void ExpectWorkers(launcher::Cluster& cluster, const std::string& log_dir, Sizes prefill,
                   Sizes decode) {
  int decoders = 0;
  for (const launcher::Process* w : cluster.workers()) {
    const Sizes want = w->role == "prefill" ? prefill : decode;
    EXPECT_EQ(Flag(*w, "--tensor-parallel-size"), std::to_string(want.tp)) << w->name;
    EXPECT_EQ(Flag(*w, "--pipeline-parallel-size"), std::to_string(want.pp)) << w->name;
    if (w->role != "decode") continue;
    ++decoders;
    EXPECT_GT(GetLoad(cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
    const std::string log = ReadFile(absl::StrCat(log_dir, "/", w->name, ".log"));
    EXPECT_NE(log.find("land through the KV head map"), std::string::npos) << w->name << " log:\n"
                                                                           << log;
  }
  EXPECT_EQ(decoders, 1);
}

struct Case {
  const char* yaml;
  Sizes prefill, decode;
};

void RunPreset(const std::string& preset, const std::vector<Case>& cases) {
  SCOPED_TRACE(preset);
  const std::string& model = PresetModelDir(preset);
  std::string log_dir;
  auto start = [&](const char* yaml) {
    return StartCluster(yaml, [&](launcher::Layout&, launcher::ClusterOptions& options) {
      options.model_dir = model;
      log_dir = options.log_dir;
    });
  };
  std::map<int, std::vector<int32_t>> want;
  {
    std::unique_ptr<launcher::Cluster> cluster = start(kMixedTp1);
    ASSERT_NE(cluster, nullptr);
    want = Serve(*cluster);
    EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
  }
  for (int n : kPromptLengths) ASSERT_EQ(want[n].size(), size_t{kMaxTokens}) << n;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    std::unique_ptr<launcher::Cluster> cluster = start(c.yaml);
    ASSERT_NE(cluster, nullptr);
    const std::map<int, std::vector<int32_t>> got = Serve(*cluster);
    ExpectWorkers(*cluster, log_dir, c.prefill, c.decode);
    for (int n : kPromptLengths) EXPECT_EQ(got.at(n), want[n]) << "prompt length " << n;
    EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
  }
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
