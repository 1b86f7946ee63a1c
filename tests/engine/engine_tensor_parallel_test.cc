// Tensor and pipeline parallelism on the CPU backend (engine/model/parallel_model.h): TP 2,
// TP 4, PP 2 and TP 2 x PP 2 against TP = 1 on every tiny make-model preset:
//   * the model: three prompts (1, 13 and 45 tokens) as one continuous batch (20-token prefill
//     chunks mixed with decode steps, page size 7, scrambled pages): last-position logits within
//     kLogitTolerance · max(1, max |logit|) of TP = 1 (fp32 KV: the only difference is the
//     summation order of the split GEMMs and the all-reduce), and the same 40 greedy tokens, with
//     bf16 KV pages as well;
//   * shapes that do not split (heads or intermediate size not divisible, KV heads neither
//     dividing nor divided) are refused at load with InvalidArgument;
//   * the engine: 20 batched, chunked requests (greedy and seeded sampling) give TP = 1's tokens;
//   * a fault injected into one rank's communicator (before the first collective, mid-step,
//     later steps; a stage's receive) breaks the engine cleanly: Step() returns Internal naming the
//     fault, every request is ended and every page free, new work is refused; nothing hangs.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/check.h"
#include "comm/group/thread_communicator.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/model/parallel_model.h"
#include "engine/model/presets.h"
#include "engine/model/tensor_shard.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::testing {
namespace {

using testing_util::GenerateGreedy;
using testing_util::SeqResult;

constexpr double kLogitTolerance = 1e-5;  // measured <= 1.1e-6 on every preset
constexpr int kNewTokens = 40;

std::string MakeTiny(const std::string& preset) {
  const std::string dir = ::testing::TempDir() + "/tp_" + preset;
  MakeModelOptions make;
  make.preset = preset;
  make.out_dir = dir;
  make.seed = 11;
  absl::StatusOr<ModelConfig> config = MakeModel(make);
  CHECK_OK(config.status());
  return dir;
}

std::vector<std::vector<int32_t>> Prompts(int vocab) {
  return {RandomPrompt(1, vocab, 1), RandomPrompt(13, vocab, 2), RandomPrompt(45, vocab, 3)};
}

struct Layout {
  int tp = 1;
  int pp = 1;
  std::string Name() const { return "TP " + std::to_string(tp) + " x PP " + std::to_string(pp); }
};
constexpr Layout kLayouts[] = {{2, 1}, {4, 1}, {1, 2}, {2, 2}};

std::vector<SeqResult> Generate(const std::string& dir, Layout l, DType kv_dtype) {
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(
      dir, Backend::kCpu, ParallelConfig{.tensor_parallel = l.tp, .pipeline_parallel = l.pp});
  CHECK_OK(model.status());
  return GenerateGreedy(**model, Prompts((*model)->config().vocab_size), kNewTokens, 7, 20,
                        kv_dtype);
}

std::vector<std::string> TinyPresets() {
  std::vector<std::string> names;
  for (const ModelPreset& p : ModelPresets()) {
    if (p.tiny) names.push_back(p.name);
  }
  return names;
}

TEST(TensorParallelTest, EveryTinyPresetMatchesTp1) {
  std::map<Architecture, std::set<std::string>> covered;
  for (const std::string& preset : TinyPresets()) {
    const std::string dir = MakeTiny(preset);
    absl::StatusOr<ModelConfig> config = ModelConfig::Load(dir);
    ASSERT_TRUE(config.ok());
    const std::vector<SeqResult> want = Generate(dir, {}, DType::kF32);
    const std::vector<SeqResult> want_bf16 = Generate(dir, {}, DType::kBF16);
    for (const Layout& layout : kLayouts) {
      SCOPED_TRACE(preset + " " + layout.Name());
      if (!CheckTensorParallel(*config, layout.tp).ok()) {
        absl::StatusOr<std::unique_ptr<Model>> refused =
            LoadModel(dir, Backend::kCpu,
                      ParallelConfig{.tensor_parallel = layout.tp, .pipeline_parallel = layout.pp});
        ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(refused.status().message().find("tensor_parallel"), std::string::npos);
        continue;
      }
      covered[config->architecture].insert(layout.Name());
      const std::vector<SeqResult> got = Generate(dir, layout, DType::kF32);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0.0;  // max |Δ| / max(1, max |logit|) over the prompts, for the log
      for (size_t s = 0; s < want.size(); ++s) {
        double max_ref = 1.0, max_diff = 0.0;
        for (size_t i = 0; i < want[s].prompt_logits.size(); ++i) {
          max_ref = std::max(max_ref, std::abs(double{want[s].prompt_logits[i]}));
          max_diff = std::max(max_diff,
                              std::abs(double{got[s].prompt_logits[i]} - want[s].prompt_logits[i]));
        }
        EXPECT_LE(max_diff, kLogitTolerance * max_ref) << "prompt " << s;
        worst = std::max(worst, max_diff / max_ref);
        EXPECT_EQ(got[s].tokens, want[s].tokens) << "prompt " << s;
        ASSERT_EQ(got[s].tokens.size(), size_t{kNewTokens});
        for (size_t i = 0; i < got[s].token_logits.size(); ++i) {
          EXPECT_LE(std::abs(got[s].token_logits[i] - want[s].token_logits[i]),
                    kLogitTolerance * max_ref)
              << "prompt " << s << " token " << i;
        }
      }
      std::cout << preset << " " << layout.Name() << ": max relative logit difference " << worst
                << "\n";
      const std::vector<SeqResult> got_bf16 = Generate(dir, layout, DType::kBF16);
      for (size_t s = 0; s < want.size(); ++s) {
        EXPECT_EQ(got_bf16[s].tokens, want_bf16[s].tokens) << "bf16 KV, prompt " << s;
      }
    }
  }
  // Every architecture ran every layout on some preset.
  for (Architecture a :
       {Architecture::kLlama, Architecture::kMistral, Architecture::kQwen2, Architecture::kQwen3}) {
    EXPECT_EQ(covered[a].size(), std::size(kLayouts)) << "architecture " << static_cast<int>(a);
  }
}

TEST(TensorParallelTest, ShapesThatDoNotSplitAreRefused) {
  ModelConfig c;
  c.num_q_heads = 6;
  c.num_kv_heads = 3;
  c.intermediate_size = 168;
  EXPECT_TRUE(CheckTensorParallel(c, 3).ok());
  EXPECT_NE(CheckTensorParallel(c, 4).message().find("attention heads"), std::string::npos);
  EXPECT_NE(CheckTensorParallel(c, 2).message().find("KV heads"), std::string::npos);
  c.num_q_heads = 8;
  c.num_kv_heads = 2;
  c.intermediate_size = 100;
  EXPECT_NE(CheckTensorParallel(c, 8).message().find("intermediate_size"), std::string::npos);
  EXPECT_EQ(CheckTensorParallel(c, 0).code(), absl::StatusCode::kInvalidArgument);
  // Replicated KV heads: 8 query heads over 8 ranks, 2 KV heads: ranks 0-3 read head 0.
  c.intermediate_size = 128;
  ASSERT_TRUE(CheckTensorParallel(c, 8).ok());
  EXPECT_EQ(ShardConfig(c, 8).num_kv_heads, 1);
  EXPECT_EQ(FirstKvHead(c, TensorShard{3, 8}), 0);
  EXPECT_EQ(FirstKvHead(c, TensorShard{4, 8}), 1);
  EXPECT_EQ(FirstKvHead(c, TensorShard{1, 2}), 1);
}

TEST(TensorParallelTest, CudaRefusesWhatItDoesNotRunAndBadConfigs) {
  const std::string dir = MakeTiny("tiny-llama3");
  // Tensor parallelism and pipeline stages run on CUDA (engine_cuda_tp_test, engine_cuda_pp_test,
  // quantized TP in engine_cuda_quant_tp_test), but tiny presets' head_dim is outside the CUDA
  // kernels' (with --quantization too).
  const absl::Status pp =
      LoadModel(dir, Backend::kCuda, ParallelConfig{.pipeline_parallel = 2}).status();
  EXPECT_EQ(pp.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(pp.message().find("head_dim"), std::string::npos) << pp;
  const absl::Status head =
      LoadModel(dir, Backend::kCuda, ParallelConfig{.tensor_parallel = 2}).status();
  EXPECT_EQ(head.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(head.message().find("head_dim"), std::string::npos) << head;
  EXPECT_EQ(
      LoadModel(dir, Backend::kCuda, ParallelConfig{.tensor_parallel = 2}, "int8").status().code(),
      absl::StatusCode::kUnimplemented);
  EXPECT_EQ(LoadModel(dir, Backend::kCpu, ParallelConfig{.tensor_parallel = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // tiny-llama3 has 2 layers: 3 stages do not fit.
  absl::StatusOr<std::unique_ptr<Model>> pp3 =
      LoadModel(dir, Backend::kCpu, ParallelConfig{.pipeline_parallel = 3});
  EXPECT_EQ(pp3.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pp3.status().message().find("pipeline_parallel 3"), std::string::npos);
}

EngineOptions Options(const std::string& dir, Layout layout) {
  EngineOptions o;
  o.model_dir = dir;
  o.page_size = 4;
  o.num_pages = 512;
  o.max_num_batched_tokens = 32;
  o.tensor_parallel = layout.tp;
  o.pipeline_parallel = layout.pp;
  return o;
}

// 20 requests, prompts of 1..90 tokens (chunked at the 32-token budget), 12 new tokens; every
// fifth sampled at temperature 1 with top-k / top-p and its own seed.
std::vector<EngineRequest> Requests(int vocab) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 20; ++i) {
    EngineRequest r = Request("t" + std::to_string(i), RandomPrompt(1 + (i * 29) % 90, vocab, i),
                              12, i % 5 == 4 ? 1.0f : 0.0f);
    r.sampling.top_k = i % 5 == 4 ? 50 : -1;
    r.sampling.top_p = i % 5 == 4 ? 0.9f : 1.0f;
    r.sampling.seed = 1000 + i;
    r.sampling.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

std::map<std::string, Finished> RunEngine(Engine& engine, const std::vector<EngineRequest>& rs) {
  for (const EngineRequest& r : rs) EXPECT_TRUE(engine.AddRequest(r).ok());
  std::map<std::string, Finished> out = RunToCompletion(engine);
  ExpectIdle(engine);
  return out;
}

// CUDA graphs are for CUDA tensor-parallel groups (engine_cuda_tp_test): a CPU group, of any
// layout, says it has none and refuses graph sizes, so the engine never asks.
TEST(TensorParallelTest, ACpuGroupHasNoGraphs) {
  const std::string dir = MakeTiny("tiny-llama3");
  for (Layout l : kLayouts) {
    SCOPED_TRACE(l.Name());
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(
        dir, Backend::kCpu, ParallelConfig{.tensor_parallel = l.tp, .pipeline_parallel = l.pp});
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_FALSE((*model)->SupportsCudaGraphs());
    const KvLayout layout = (*model)->KvPoolLayout(16);
    ModelPrepareOptions graphs;
    graphs.cuda_graph_sizes = {1, 2};
    const absl::Status s = (*model)->Prepare(graphs, layout, nullptr);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("eagerly"), std::string::npos) << s;
    EXPECT_TRUE((*model)->Prepare(ModelPrepareOptions{}, layout, nullptr).ok());
  }
}

TEST(TensorParallelTest, EngineBatchesGiveTp1Tokens) {
  for (const char* preset : {"tiny-llama3", "tiny-qwen3"}) {
    const std::string dir = MakeTiny(preset);
    absl::StatusOr<std::unique_ptr<Engine>> tp1 = Engine::Create(Options(dir, {}));
    ASSERT_TRUE(tp1.ok()) << tp1.status();
    const std::vector<EngineRequest> requests = Requests((*tp1)->model_config().vocab_size);
    const std::map<std::string, Finished> want = RunEngine(**tp1, requests);
    for (const Layout& layout : kLayouts) {
      SCOPED_TRACE(std::string(preset) + " " + layout.Name());
      absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(Options(dir, layout));
      ASSERT_TRUE(engine.ok()) << engine.status();
      // The group's pool: TP stacks of the layers, each of the rank's KV heads.
      EXPECT_EQ((*engine)->kv_layout().num_layers, layout.tp * (*tp1)->kv_layout().num_layers);
      const std::map<std::string, Finished> got = RunEngine(**engine, requests);
      ASSERT_EQ(got.size(), want.size());
      for (const auto& [id, f] : want) {
        EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
        EXPECT_EQ(got.at(id).reason, FinishReason::kLength) << id;
        EXPECT_EQ(got.at(id).num_terminal_events, 1) << id;
      }
    }
  }
}

// tiny-llama3 has 2 layers. TP 2: 4 all-reduces per step, the fault at rank 1's all-reduce
// number `calls`: 0 (the first step's first), 2 (mid-step), 9 (the third step). TP 2 x PP 2:
// one all-reduce per layer and stage (2 per step), the fault in stage 1's TP group. PP 2: one
// transfer per step, the fault at stage 1's receive (world rank 1).
TEST(TensorParallelTest, CommunicatorFaultBreaksTheEngineCleanly) {
  const std::string dir = MakeTiny("tiny-llama3");
  struct Case {
    Layout layout;
    int stage;      // whose TP group faults; -1: the group-wide communicator
    int rank;       // within it
    int64_t calls;  // its collectives / transfers before the fault
    int per_step;   // of those, per step
  };
  for (const Case& c :
       {Case{{2, 1}, 0, 1, 0, 4}, Case{{2, 1}, 0, 1, 2, 4}, Case{{2, 1}, 0, 1, 9, 4},
        Case{{2, 2}, 1, 1, 3, 2}, Case{{1, 2}, -1, 1, 0, 1}, Case{{1, 2}, -1, 1, 2, 1}}) {
    SCOPED_TRACE(c.layout.Name() + ", fault at call " + std::to_string(c.calls));
    absl::StatusOr<ParallelGroups> groups = ParallelGroups::Create(
        ParallelConfig{.tensor_parallel = c.layout.tp, .pipeline_parallel = c.layout.pp});
    ASSERT_TRUE(groups.ok());
    ThreadCommGroup& faulty = c.stage < 0 ? *groups->world : *groups->stages[c.stage];
    faulty.InjectFault(c.rank, c.calls, absl::InternalError("rank 1 lost its device (injected)"));
    absl::StatusOr<std::unique_ptr<Model>> model = LoadParallelModel(
        dir, ParallelConfig{.tensor_parallel = c.layout.tp, .pipeline_parallel = c.layout.pp},
        *std::move(groups));
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::CreateWithModel(Options(dir, c.layout), *std::move(model));
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    for (const EngineRequest& r : Requests(e.model_config().vocab_size)) {
      ASSERT_TRUE(e.AddRequest(r).ok());
    }
    const StepsUntilFailure run = StepUntilFailure(e, 1000);
    const int steps = run.steps;
    // With PP the engine keeps two micro-batches in flight: micro-batch k, launched by Step()
    // k + 1, is collected by Step() k + 3, unless the next launch (Step() k + 2) already finds
    // the group down.
    const int64_t k = c.calls / c.per_step;
    if (c.layout.pp > 1) {
      EXPECT_GE(steps, k + 2);
      EXPECT_LE(steps, k + 3);
    } else {
      EXPECT_EQ(steps, k + 1);
    }
    ExpectFailedByInjectedFault(e, run.status);
  }
}

}  // namespace
}  // namespace tandem::testing
